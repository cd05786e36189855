"""FP8 (E4M3FN) fake quantization and placement: numbers against ONNX Runtime's FP8 Q/DQ, and
the placement rule (TensorRT's INT8 inputs, kept only at layers TensorRT runs in FP8)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch import nn

from embedl_dynamo.backend import backend_by_name
from embedl_dynamo.quant.fp8.placement import fp8_float_reasons
from embedl_dynamo.quant.fp8.qdq import (
    FP8_MAX,
    FP8FakeQuantize,
    FP8QuantizeDequantize,
    FP8WeightFakeQuantize,
)
from embedl_dynamo.quant.fp8.stage import check_fp8_quantizer, quantize_fp8
from embedl_dynamo.quant.int8.insert import FakeQuantize, WeightFakeQuantize
from embedl_dynamo.quant.int8.stage import calibrate_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.runtimes.onnxruntime.session import create_session
from tests.helpers import random_batches
from tests.models import ViTLike


def _ort_qdq(x: np.ndarray, scale: np.ndarray, axis: int | None) -> np.ndarray:
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, list(scale.shape), [0] * scale.size)
    s = helper.make_tensor("s", TensorProto.FLOAT, list(scale.shape), scale.ravel().tolist())
    attrs = {} if axis is None else {"axis": axis}
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [s, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return create_session(model.SerializeToString()).run(None, {"x": x})[0]


def test_fp8_qdq_equals_onnxruntime_per_tensor_and_per_channel():
    torch.manual_seed(0)
    # beyond +-448*scale (saturates), subnormals, ties between E4M3 values, zeros
    x = torch.cat(
        [torch.randn(512) * 3, torch.tensor([0.0, 1e-4, -1e-4, 1.0625, 2.125, 5e3, -5e3])]
    )
    scale = torch.tensor(0.01)
    ours = FP8QuantizeDequantize.apply(x, scale, None)
    theirs = _ort_qdq(x.numpy(), scale.numpy().reshape(()), None)
    np.testing.assert_array_equal(ours.numpy(), theirs)
    assert ours.abs().max().item() == pytest.approx(FP8_MAX * 0.01)
    w = torch.randn(8, 4, 3, 3) * torch.logspace(-2, 1, 8).reshape(-1, 1, 1, 1)
    fq = FP8WeightFakeQuantize(w.abs().amax(dim=(1, 2, 3)))
    theirs = _ort_qdq(w.numpy(), fq.scale.numpy(), 0)
    np.testing.assert_array_equal(fq(w).numpy(), theirs)
    # per channel amax maps to 448 exactly: the largest weight of each channel is kept
    torch.testing.assert_close(fq(w).abs().amax(dim=(1, 2, 3)), w.abs().amax(dim=(1, 2, 3)))


def test_fp8_has_a_straight_through_gradient_inside_the_range():
    x = torch.tensor([0.5, -3.0, 10.0], requires_grad=True)
    FP8FakeQuantize(amax=4.0)(x).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 0.0]


def test_a_relu_before_an_fp8_quantize_is_kept_on_onnxruntime():
    """ONNX Runtime 1.32 drops it (ReluQuantFusion) unless create_session holds the rule off."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "relu_q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    out = create_session(model.SerializeToString()).run(None, {"x": x})[0]
    assert out.tolist() == [0.0, 0.0, 1.0, 2.0]


class _Mixed(nn.Module):
    """Convs TensorRT runs in FP8 and ones it does not, a fused residual, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)  # 3 input channels: not in FP8
        self.wide = nn.Conv2d(32, 32, 3, padding=1)  # FP8
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4)  # 8 per group: not in FP8
        self.big = nn.Conv2d(32, 32, 7, padding=3)  # 49 taps: not in FP8
        self.res = nn.Conv2d(32, 32, 3, padding=1)  # FP8, its residual Add too
        self.fc = nn.Linear(32, 10)  # FP8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = F.relu(self.wide(x))
        y = self.big(self.grouped(x))
        x = F.relu(self.res(y) + x)
        return self.fc(x.mean((2, 3)))


def _fused(model: nn.Module, x: torch.Tensor):
    target = backend_by_name("tensorrt")
    plan = plan_transformation(
        model, [*target.conversion_patterns, *target.fusion_patterns], args=(x,)
    )
    return apply_transformation_plan(plan).model, target.quantizer


def _points(gm, kinds) -> set[str]:
    """What each quantizer of ``gm`` quantizes: the value's node name, or the weight's owner."""
    found = set()
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), kinds):
            found.add(node.args[0].name)
    for name, module in gm.named_modules():
        if isinstance(module, kinds) and ".parametrizations." in name:
            found.add("weight:" + name.split(".parametrizations.")[0])
    return found


def _int8_points_of(calibrated, layer_ids) -> set[str]:
    points = set()
    for ident in layer_ids:
        layer = calibrated.placement.layers[ident]
        points |= set(layer.activations)
        points |= {"weight:" + k.rpartition(".")[0] for k in layer.weights}
    return points


@pytest.mark.parametrize(
    ("make", "shape", "fp8", "float_reasons"),
    [
        (
            _Mixed,
            (2, 3, 16, 16),
            {"quant_conv@wide", "quant_conv@res", "quant_residual_add@add_1", "quant_linear@fc"},
            {
                "quant_conv@stem": "3 input channels / 32 output channels, not both above 16",
                "quant_conv@grouped": "8 input channels per group / 32 output channels",
                "quant_conv@big": "filter of 49 taps, above 32",
            },
        ),
        (lambda: ViTLike(dim=32, heads=2).eval(), (2, 3, 16, 16), None, {}),
    ],
    ids=["cnn", "vit"],
)
def test_fp8_sits_exactly_at_the_int8_inputs_of_fp8_layers(make, shape, fp8, float_reasons):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(shape)
    gm, quantizer = _fused(model, x)
    data = random_batches(shape, n=2)
    calibrated = calibrate_graph(gm, quantizer, data, use_cache=False, progress=False)
    int8, _ = calibrated.build()
    fp8_model, report = quantize_fp8(gm, quantizer, data, use_cache=False, progress=False)
    reasons = fp8_float_reasons(calibrated.gm, calibrated.placement)
    kept = [i for i in calibrated.placement.quantized_layers if i not in reasons]
    if fp8 is not None:  # the CNN: every decision named
        assert set(kept) == fp8
        assert {
            i: next(r for r in reasons.values() if r.find(want) >= 0)
            for i, want in float_reasons.items()
        } == {i: reasons[i] for i in float_reasons}
    else:  # the ViT: every linear, attention GEMM and residual add FP8; the 3-channel stem not
        assert any(i.startswith("quant_residual_add@") for i in kept)
        assert any(i.startswith("quant_fused_module@") for i in kept)
        assert set(reasons) == {"quant_conv@patch_embed"}
    # FP8 exactly at the INT8 inputs of the FP8 layers ...
    expected = _int8_points_of(calibrated, kept)
    got = _points(fp8_model, (FP8FakeQuantize, FP8WeightFakeQuantize))
    assert got == expected
    # ... and nowhere else: a subset of INT8's points, and no INT8 quantizer left behind
    assert got <= _points(int8, (FakeQuantize, WeightFakeQuantize))
    assert not _points(fp8_model, (FakeQuantize, WeightFakeQuantize))
    assert report["quantized_layers"] == kept
    assert {r["id"]: r["precision"] for r in report["layers"]} == {
        **{i: "fp8" for i in kept},
        **{i: "fp32" for i in reasons},
        **{i: "fp32" for i, _ in calibrated.placement.float_layers},
    }


def test_fp8_is_refused_for_a_target_without_symmetric_int8():
    check_fp8_quantizer(backend_by_name("tensorrt").quantizer)  # passes
    with pytest.raises(ValueError, match="backend='tensorrt'"):
        check_fp8_quantizer(backend_by_name("onnxruntime").quantizer)


def test_fp8_onnx_numbers_equal_the_fake_quant_graph(tmp_path):
    from embedl_dynamo.onnx.export import export_onnx

    torch.manual_seed(0)
    model = _Mixed().eval()
    x = torch.randn(2, 3, 16, 16)
    gm, quantizer = _fused(model, x)
    fp8_model, _ = quantize_fp8(
        gm, quantizer, random_batches((2, 3, 16, 16), n=2), use_cache=False, progress=False
    )
    path = export_onnx(fp8_model, (x,), tmp_path / "fp8.onnx")
    file = onnx.load(str(path))
    assert file.opset_import[0].version >= 19
    out = create_session(str(path)).run(None, {"input_0": x.numpy()})[0]
    with torch.no_grad():
        expected = fp8_model(x).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="opset 19"):
        export_onnx(fp8_model, (x,), tmp_path / "old.onnx", opset=18)
