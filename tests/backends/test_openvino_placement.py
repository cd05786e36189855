"""The ``openvino`` target's placement (NNCF's CPU placement): depthwise convs, squeeze-excite
scales and the ``q k^T`` of attention are quantized; what each rule declines, and why."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo import quantize
from embedl_dynamo.patterns.attention import FusedAttention
from embedl_dynamo.quant.int8.insert import FakeQuantize, WeightFakeQuantize
from tests.helpers import is_fake_quant, random_batches
from tests.models import MobileNetLike, ResNetLike, ViTLike, randomize_batchnorm


def _quantized(model, shape, backend="openvino"):
    x = torch.randn(*shape)
    q = quantize(model, (x,), backend=backend, calibration_data=random_batches(shape))
    return q, q.meta["embedl_quantization"], x


def test_every_conv_is_quantized_depthwise_and_squeeze_excite_included():
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    q, report, x = _quantized(model, (1, 3, 32, 32))
    assert report["float_layers"] == []
    convs = [i for i in report["quantized_layers"] if i.startswith("quant_conv_ov@")]
    # every nn.Conv2d (stem, expand, depthwise, SE fc1/fc2, project) is a quantized conv, and
    # so is the first classifier linear (a conversion makes the pooled linear a 1x1 conv)
    paths = {i.split("@")[1] for i in convs}
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            assert name in paths
    assert sum("depthwise" in i for i in convs) == 3
    scales = [i for i in report["quantized_layers"] if i.startswith("quant_channel_scale@")]
    assert len(scales) == 2  # the two blocks with squeeze-excite
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(q(x).flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.98


class _Scales(nn.Module):
    """A squeeze-excite gate written gate-first, a layer scale (constant) and a product of two
    feature maps."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)
        self.gate = nn.Conv2d(8, 8, 1)
        self.layer_scale = nn.Parameter(torch.full((1, 8, 1, 1), 0.5))

    def forward(self, x):
        y = self.conv(x)
        gate = torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))
        z = gate * y  # squeeze-excite, gate first
        return (z * self.layer_scale) * torch.tanh(z)


def test_channel_scale_takes_either_order_and_declines_with_a_reason():
    torch.manual_seed(0)
    model = _Scales().eval()
    q, report, x = _quantized(model, (2, 8, 6, 6))
    scales = [i for i in report["quantized_layers"] if i.startswith("quant_channel_scale@")]
    assert len(scales) == 1
    reasons = {f["reason"] for f in report["float_layers"]}
    assert "an input is a constant (a scale, not a squeeze-excite gate)" in reasons
    assert any("not a feature map times a per-channel gate" in r for r in reasons)
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(q(x).flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.99


@pytest.mark.parametrize("heads", [2, 4])
def test_attention_quantizes_q_and_k_for_any_head_size(heads):
    torch.manual_seed(0)
    model = ViTLike(heads=heads).eval()  # head size 16 or 8: OpenVINO takes both
    q, report, x = _quantized(model, (2, 3, 16, 16))
    attention = [i for i in report["quantized_layers"] if i.startswith("quant_fused_attention_ov")]
    assert len(attention) == 2
    assert not [f for f in report["float_layers"] if "attention" in f["id"]]
    attention_calls = [
        n
        for n in q.graph.nodes
        if n.op == "call_module" and isinstance(q.get_submodule(n.target), FusedAttention)
    ]
    assert len(attention_calls) == 2
    for call in attention_calls:
        # q and k enter through a fake-quant; v stays float
        assert [is_fake_quant(q, a) for a in call.args[:3]] == [True, True, False], call.args
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(q(x).flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.99


def test_a_transformer_residual_stream_stays_float():
    torch.manual_seed(0)
    model = randomize_batchnorm(ViTLike(heads=2).eval())
    _, report, _ = _quantized(model, (2, 3, 16, 16))
    streams = [f for f in report["float_layers"] if "residual stream" in f["reason"]]
    assert len(streams) == 4  # two blocks, two residual adds each
    assert not [i for i in report["quantized_layers"] if i.startswith("quant_residual_add_ov")]


def _calibrated_ranges(q, batches):
    """``{fake-quant name: (lowest min, mean min, mean max)}`` of each fake-quant's input over
    ``batches`` (NNCF's MEAN_MINMAX: the mean of each batch's min and max; the lowest decides
    the sign), computed as calibration saw it: every fake-quant passes its input through."""
    fakes = {n: m for n, m in q.named_modules() if isinstance(m, FakeQuantize)}
    seen: dict[str, list[tuple[float, float]]] = {}

    def recorder(name):
        def record(module, inputs, output):
            seen.setdefault(name, []).append((float(inputs[0].min()), float(inputs[0].max())))
            return inputs[0]

        return record

    handles = [m.register_forward_hook(recorder(n)) for n, m in fakes.items()]
    handles += [
        m.register_forward_hook(lambda module, inputs, output: inputs[0])
        for m in q.modules()
        if isinstance(m, WeightFakeQuantize)
    ]
    try:
        with torch.no_grad():
            for batch in batches:
                q(batch)
    finally:
        for handle in handles:
            handle.remove()
    return {
        name: (min(lo for lo, _ in pairs), *(sum(v) / len(v) for v in zip(*pairs)))
        for name, pairs in seen.items()
    }


def test_post_relu_activations_are_uint8_from_zero_and_signed_ones_int8():
    """NNCF's convention: a value with no negative calibrated value gets uint8 over [0, max]
    (zero point 0), twice the resolution of symmetric int8; the others symmetric int8."""
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    shape = (1, 3, 32, 32)
    q, _, _ = _quantized(model, shape)
    fakes = {n: m for n, m in q.named_modules() if isinstance(m, FakeQuantize)}
    calibrated = _calibrated_ranges(q, random_batches(shape))  # the data _quantized calibrated on
    assert set(calibrated) == set(fakes)
    for name, fake in fakes.items():
        lowest, lo, hi = calibrated[name]
        assert int(fake.zero_point) == 0, name
        if lowest >= 0.0:  # [0, max] over 255 steps: scale max / 255, half of int8's max / 127
            assert (fake.qmin, fake.qmax) == (0, 255), name
            assert math.isclose(float(fake.scale), hi / 255, rel_tol=1e-6), name
        else:  # symmetric int8 over [-amax, amax]
            assert (fake.qmin, fake.qmax) == (-128, 127), name
            assert math.isclose(float(fake.scale), max(-lo, hi) / 127, rel_tol=1e-6), name
    # the SE gates (hardsigmoid, in [0, 1]) and the SE's ReLU outputs are the unsigned ones;
    # hardswish dips to -3/8, so the maps after it (pooled ones too) stay signed int8
    unsigned = {n for n, m in fakes.items() if (m.qmin, m.qmax) == (0, 255)}
    assert unsigned == {
        f"fq_conv_{act}_blocks_{block}_se_{fc}"
        for block in (0, 2)
        for act, fc in (("relu", "fc1"), ("hardsigmoid", "fc2"))
    }
    pooled = [n for n in fakes if "adaptive_avg_pool" in n]
    assert len(pooled) == 3 and not unsigned & set(pooled)


def _max_pools(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.max_pool2d]


def test_a_stems_max_pool_reads_the_quantized_relu_and_its_output_has_no_second_qdq():
    """NNCF's propagation: the Q/DQ sits between the relu and the pool, so OpenVINO writes the
    stem conv's output as u8 and pools in u8 (the Q/DQ after the pool left both in f32)."""
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike()).eval()
    q, report, x = _quantized(model, (2, 3, 32, 32))
    assert [i for i in report["quantized_layers"] if i.startswith("quant_max_pool_input@")]
    (pool,) = _max_pools(q)
    assert is_fake_quant(q, pool.kwargs["input"])  # the pool reads Q/DQ'd values
    assert not any(is_fake_quant(q, user) for user in pool.users)  # and none after it
    with torch.no_grad():
        cosine = F.cosine_similarity(q(x).flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.98


class _PoolAndSkip(nn.Module):
    """A relu output read by a max pool and by a second branch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.after(F.max_pool2d(y, 3, 2, 1)) + F.avg_pool2d(y, 2)


def test_a_pool_whose_input_has_other_readers_keeps_its_qdq_after_and_says_why():
    torch.manual_seed(0)
    q, report, _ = _quantized(_PoolAndSkip().eval(), (2, 3, 16, 16))
    reasons = {f["reason"] for f in report["float_layers"] if "max_pool_input" in f["id"]}
    assert reasons == {"the pool's input has other readers (its Q/DQ would reach them)"}
    (pool,) = _max_pools(q)
    assert any(is_fake_quant(q, user) for user in pool.users)  # the conv after it reads Q/DQ


def test_max_pooling_commutes_with_a_per_tensor_quantization():
    """Why one Q/DQ before the pool replaces the one after: the same integers, bit for bit."""
    torch.manual_seed(0)
    y = torch.relu(torch.randn(2, 8, 17, 17))
    scale = float(y.max()) / 255

    def fake_quant(t):
        return torch.fake_quantize_per_tensor_affine(t, scale, 0, 0, 255)

    pool = lambda t: F.max_pool2d(t, 3, 2, 1)  # noqa: E731
    assert torch.equal(pool(fake_quant(y)), fake_quant(pool(y)))


class _IntegerAdd(nn.Module):
    """A float residual add and an add of int32 counts (an index guard's form)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        y = y + torch.relu(self.conv2(y))
        counts = (y > 1).int() + (y < -1).int()
        return y * counts


def test_an_add_of_integers_gets_no_qdq_and_int8_runs():
    """Regression: an add of int32 counts (the index guard's form) was given Q/DQ, which fake
    quantization refuses (and OpenVINO failed to compile EfficientNet-B0's INT8 file): INT8
    was rejected and fp32 ran."""
    torch.manual_seed(0)
    model = _IntegerAdd().eval()
    x = torch.randn(2, 3, 8, 8)
    batches = random_batches((2, 3, 8, 8))
    options = {"precision": "int8", "calibration_data": batches, "accuracy_budget": 0.95}
    with torch.inference_mode():
        y = torch.compile(model, backend="embedl_openvino", options=options)(x)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", "openvino"), sub.reason
    assert sub.pipeline["quantized"] and not sub.pipeline.get("lower_rejected"), sub.reason
    cosine = torch.nn.functional.cosine_similarity(y.flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.95
