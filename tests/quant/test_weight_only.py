"""Weight-only int8/int4 (:mod:`embedl_dynamo.quant.weight_only.linear`): which linears are
rewritten and why, the dequantised weights' numbers, the budget, and the options' validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedl_dynamo.backend import as_backend
from embedl_dynamo.quant.weight_only import linear
from embedl_dynamo.quant.weight_only.codes import (
    WeightOnlySpec,
    dequantize_weight,
    dequantize_weight_t,
    quantize_weight,
)
from embedl_dynamo.quant.weight_only.linear import (
    WeightOnlyLinear,
    dense_weights,
    weight_only_graph,
)
from embedl_dynamo.quant.weight_only.stage import weight_only_stage
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.settings import Settings


class TinyDecoderBlock(nn.Module):
    """An embedding, an MLP of linears (one with in_features 48), a matmul of two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 128)
        self.up = nn.Linear(128, 256)
        self.down = nn.Linear(256, 48, bias=False)
        self.odd = nn.Linear(48, 128)
        self.head = nn.Linear(128, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        attn = torch.softmax(h @ h.transpose(1, 2), -1) @ h  # no constant weight: not a linear
        y = self.odd(self.down(F.silu(self.up(h + attn))))
        return self.head(y)


def _fused(model: nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    return apply_transformation_plan(plan_transformation(model, patterns, args=args)).model


def _ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = TinyDecoderBlock().eval()
    return model, _fused(model, _ids())


def _precisions(report: dict) -> dict[str, tuple[str, str]]:
    return {r["id"].split("@")[1]: (r["precision"], r["reason"]) for r in report["layers"]}


def test_int4_rewrites_every_constant_linear_and_says_why_some_keep_8_bits(block):
    model, gm = block
    spec = WeightOnlySpec(4, group_size=128)
    quantized, report = weight_only_graph(gm, [_ids()], spec)
    layers = _precisions(report)
    assert set(layers) == {"up", "down", "odd", "head"}
    assert layers["up"][0] == layers["down"][0] == "int4_weight_only"
    # 48 input features: no whole group of 128
    assert layers["odd"][0] == "int8_weight_only"
    assert "not a multiple of group size 128" in layers["odd"][1]
    # without an accuracy budget the output head keeps 8 bits, as NNCF does by default
    assert layers["head"][0] == "int8_weight_only"
    assert "output head" in layers["head"][1] and "without an accuracy_budget" in layers["head"][1]
    rewritten = [m for m in quantized.modules() if isinstance(m, WeightOnlyLinear)]
    assert sorted(m.spec.bits for m in rewritten) == [4, 4, 8, 8]
    # the embedding table and the activation matmuls are not linears with a constant weight
    assert any(isinstance(m, nn.Embedding) for m in quantized.modules())
    assert report["kept_int8"] == [] and report["cosine"] is None


def test_int8_rewrites_every_linear_per_channel(block):
    _, gm = block
    quantized, report = weight_only_graph(gm, [_ids()], WeightOnlySpec(8))
    assert {p for p, _ in _precisions(report).values()} == {"int8_weight_only"}
    scales = [m.scale.shape for m in quantized.modules() if isinstance(m, WeightOnlyLinear)]
    assert all(s[1] == 1 for s in scales), scales  # one scale per output channel


def test_outputs_are_the_float_graph_with_dequantised_weights(block):
    model, gm = block
    quantized, _ = weight_only_graph(gm, [_ids()], WeightOnlySpec(4, group_size=32))
    ids = _ids()
    layer = next(m for m in quantized.modules() if isinstance(m, WeightOnlyLinear))
    x = torch.randn(3, 128)
    expected = F.linear(x, dequantize_weight(layer.codes, layer.scale, layer.zero_point))
    assert layer.activation == "silu"  # up: linear + silu, fused
    expected = F.silu(expected + layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        out, ref = quantized(ids), model(ids)
    cosine = F.cosine_similarity(out.flatten().double(), ref.flatten().double(), 0).item()
    assert 0.99 < cosine < 1.0  # quantized, and close


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_dequantised_weight_is_within_one_step_of_float(bits, symmetric):
    torch.manual_seed(0)
    w = torch.randn(64, 256) * torch.rand(64, 1) + 0.3 * torch.rand(64, 1)  # off-centre rows
    spec = WeightOnlySpec(bits, group_size=64, symmetric=symmetric)
    q, scale, zero = quantize_weight(w, spec)
    groups = 256 // spec.group(256)
    assert scale.shape == (64, groups)
    low, high = (-(2 ** (bits - 1)) + 1, 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    assert q.min() >= low and q.max() <= high
    assert (zero is None) == symmetric
    error = (w - dequantize_weight(q, scale, zero)).abs().reshape(64, groups, -1)
    # rounding: half a step; asymmetric: up to one step where the zero point was rounded
    bound = scale[..., None] * (0.5 if symmetric else 1.0) + 1e-6
    assert (error <= bound).all()
    assert error.max() > 0  # it did quantize


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_the_transposed_dequantisation_gives_the_same_numbers(bits, symmetric):
    """The exporter's ``W'.T`` is dequantized from transposed codes: bit for bit the same."""
    torch.manual_seed(0)
    q, scale, zero = quantize_weight(torch.randn(48, 256), WeightOnlySpec(bits, 64, symmetric))
    weight_t = dequantize_weight_t(q, scale, zero)
    assert weight_t.is_contiguous() and weight_t.shape == (256, 48)
    assert torch.equal(weight_t, dequantize_weight(q, scale, zero).t())


def test_budget_keeps_int4_layers_at_8_bits_and_reports_them(block):
    _, gm = block
    spec = WeightOnlySpec(4, group_size=32)
    _, plain = weight_only_graph(gm, [_ids()], spec, accuracy_budget=0.5)
    assert plain["kept_int8"] == [] and plain["cosine"] > 0.5
    # within a budget the output head is int4 like the rest (without one it keeps 8 bits)
    assert _precisions(plain)["head"][0] == "int4_weight_only"
    quantized, strict = weight_only_graph(gm, [_ids()], spec, accuracy_budget=0.999999)
    assert strict["kept_int8"], strict
    # the head, whose error reaches the outputs directly, is the first to keep 8 bits
    assert strict["kept_int8"][0].endswith("@head")
    assert "the output head keeps 8 bits" in _precisions(strict)["head"][1]
    kept = {k.split("@")[1] for k in strict["kept_int8"]}
    layers = _precisions(strict)
    assert all(layers[k][0] == "int8_weight_only" for k in kept)
    assert all("accuracy_budget" in layers[k][1] for k in kept)
    assert strict["cosine"] > plain["cosine"]


@pytest.mark.parametrize(
    ("backend", "symmetric"), [("tensorrt", True), ("onnxruntime", False), ("openvino", False)]
)
def test_stage_defaults_to_symmetric_only_for_tensorrt(block, backend, symmetric):
    _, gm = block
    settings = Settings(precision="int4_weight_only", weight_only_group_size=32)
    model, entries = weight_only_stage(gm, [_ids()], as_backend(backend), settings)
    assert entries["weight_only"]["symmetric"] is symmetric
    assert entries["weight_only"]["group_size"] == 32
    assert len(entries["layers"]) == 4
    layers = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
    assert all((m.zero_point is None) == symmetric for m in layers)


@pytest.mark.parametrize("group", [100, 8, 512, True, "128"])
def test_invalid_group_size_names_the_valid_ones(group):
    with pytest.raises(ValueError, match="power of two from 16 to 256"):
        WeightOnlySpec(4, group_size=group)
    with pytest.raises(ValueError, match="weight_only_group_size"):
        Settings(weight_only_group_size=group)


def test_invalid_bits_symmetry_and_shapes_are_refused():
    with pytest.raises(ValueError, match="expected 4 or 8"):
        WeightOnlySpec(3)
    with pytest.raises(ValueError, match="weight_only_symmetric"):
        Settings(weight_only_symmetric="yes")
    with pytest.raises(ValueError, match="not a multiple"):
        quantize_weight(torch.randn(4, 48), WeightOnlySpec(4, group_size=32))
    with pytest.raises(ValueError, match="2-d"):
        quantize_weight(torch.randn(4, 4, 4), WeightOnlySpec(8))
    with pytest.raises(ValueError, match="not weight-only"):
        weight_only_stage(None, [], None, Settings(precision="int8"))


def test_precision_names_are_registered_as_lower_precisions_without_calibration():
    settings = Settings.from_options({"precision": "int4_weight_only"}, env={})
    precision = settings.precision
    assert precision.lower and not precision.calibrates and not precision.quantizes
    assert precision.load_stage() is weight_only_stage
    env = {"EMBEDL_DYNAMO_PRECISION": "int8_weight_only"}
    assert Settings.from_options(None, env=env).precision.name == "int8_weight_only"


class TableLookup(nn.Module):
    """A constant table read by ``get_attr`` (as in a frozen Dynamo graph), a buffer written in
    place, and an output linear."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(50, 128))
        self.register_buffer("steps", torch.zeros(1))
        self.head = nn.Linear(128, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return self.head(F.embedding(ids, self.table)) + self.steps


@pytest.mark.filterwarnings("ignore:.*mutates steps in place")
def test_the_quantized_copy_shares_only_constants_nothing_writes_in_place():
    torch.manual_seed(0)
    gm = _fused(TableLookup().eval(), _ids())
    quantized, _ = weight_only_graph(gm, [_ids()], WeightOnlySpec(8))
    # no copy of an LLM's float embedding table: the copy holds its int8 codes instead
    assert not hasattr(quantized, "table") and gm.table.dtype == torch.float32
    # a buffer the graph writes stays each graph's own, so running one cannot change the other
    assert quantized.steps is not gm.steps
    quantized(_ids())
    assert float(gm.steps) == 0.0 and float(quantized.steps) == 1.0


def test_a_layer_keeps_integer_weights_only_and_a_float_one_while_exported(block):
    """No float copy of the weight outlives quantization (an LLM's would double the compile's
    memory); ``dense_weights`` gives the exporter ``W'.T`` for as long as it runs."""
    _, gm = block
    quantized, _ = weight_only_graph(gm, [_ids()], WeightOnlySpec(8))
    layer = next(m for m in quantized.modules() if isinstance(m, WeightOnlyLinear))
    floats = [n for n, t in layer.named_buffers() if t.is_floating_point() and t.dim() == 2]
    assert floats == ["scale"] and layer.scale.shape[1] == 1  # one scale per output channel
    dense = dequantize_weight(layer.codes, layer.scale, layer.zero_point).t()
    with dense_weights(quantized) as layers:
        assert layer in layers
        torch.testing.assert_close(layer.weight_t, dense, rtol=0, atol=0)
        assert layer.weight_t.is_contiguous()
        with torch.no_grad():
            held = quantized(_ids())
    assert "weight_t" not in dict(layer.named_buffers())
    with torch.no_grad():
        torch.testing.assert_close(quantized(_ids()), held, rtol=0, atol=0)


def test_the_budget_quantizes_each_layer_once_per_bit_width(block, monkeypatch):
    _, gm = block
    calls = []
    original = linear.quantize_weight
    monkeypatch.setattr(
        linear, "quantize_weight", lambda w, s: calls.append(s.bits) or original(w, s)
    )
    spec = WeightOnlySpec(4, group_size=32)
    _, report = weight_only_graph(gm, [_ids()], spec, accuracy_budget=0.999999)
    linears = len(report["layers"])
    assert report["kept_int8"]  # several attempts ran
    # the first build quantizes every layer; each attempt only the layers it moves to 8 bits
    assert len(calls) == linears + len(report["kept_int8"])
