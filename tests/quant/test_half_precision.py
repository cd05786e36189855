"""FP16/BF16 in the graph (:mod:`embedl_dynamo.quant.half.stage`): which ops go half, which
stay fp32, the casts, the numbers, and the artifact that carries the types."""

from __future__ import annotations

import json

import expecttest
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.quant.half.stage import cast_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from tests.models import MobileNetLike, ViTLike

pytestmark = pytest.mark.usefixtures("compile_isolation")


class SmallNet(nn.Module):
    """Conv-BN-ReLU, a depthwise conv with a residual, a mean, LayerNorm, softmax, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = y + self.c2(y)
        y = self.fc(self.ln(y.mean((2, 3))))
        return self.head(torch.softmax(y, -1) * y)


def _fused(model: nn.Module, *x: torch.Tensor) -> torch.fx.GraphModule:
    target = as_backend("tensorrt")
    plan = plan_transformation(
        model, [*target.conversion_patterns, *target.fusion_patterns], args=x
    )
    return apply_transformation_plan(plan).model


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), 0).item()


class HalfPrecisionGraph(expecttest.TestCase):
    def test_fp16_graph_casts_only_where_precision_changes(self) -> None:
        torch.manual_seed(0)
        x = torch.randn(2, 3, 16, 16)
        cast, layers = cast_graph(_fused(SmallNet().eval(), x), [x], "fp16")
        self.assertExpectedInline(
            format_graph(cast, literals=True),
            """\
input x
to = .to(x, torch.float16)
conv_bn_relu_c1 = FusedConv[relu](to)
conv_c2 = FusedConv(conv_bn_relu_c1)
add_1 = add(input=conv_bn_relu_c1, other=conv_c2, alpha=1)
to_1 = .to(add_1, torch.float32)
mean = .mean(to_1, (2, 3))
layer_norm_ln = FusedLayerNorm(mean)
to_2 = .to(layer_norm_ln, torch.float16)
linear_fc = FusedLinear(to_2)
to_3 = .to(linear_fc, torch.float32)
softmax_1 = softmax(input=to_3, dim=-1, _stacklevel=3, dtype=None)
mul_1 = mul(input=softmax_1, other=linear_fc)
linear_head = FusedLinear(mul_1)
return linear_head""",
        )
        precisions = {r["id"]: r["precision"] for r in layers}
        self.assertEqual(precisions["conv_bn_relu@c1"], "fp16")
        self.assertEqual(precisions["linear@fc"], "fp16")
        self.assertEqual(precisions["linear@head"], "fp32")  # the logits
        self.assertIn("logits", next(r["reason"] for r in layers if r["id"] == "linear@head"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("make", [SmallNet, MobileNetLike, ViTLike])
def test_cast_graph_keeps_outputs_close_and_in_fp32(make, precision) -> None:
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 3, 16, 16)
    fused = _fused(model, x)
    weights = {k: v.clone() for k, v in fused.state_dict().items()}
    with torch.no_grad():
        expected = fused(x)
        cast, layers = cast_graph(fused, [x], precision)
        got = cast(x)
    assert got.dtype == torch.float32
    assert all(torch.equal(v, fused.state_dict()[k]) for k, v in weights.items())  # not mutated
    # half keeps ~3 significant digits (bf16 ~2): a relative bound on the outputs' scale
    bound = 2e-3 if precision == "fp16" else 2e-2
    assert (got - expected).abs().max().item() <= bound * expected.abs().max().item()
    assert _cosine(got, expected) > 0.999
    assert any(r["precision"] == precision for r in layers)


def test_sensitive_ops_run_in_fp32_inside_the_cast_graph() -> None:
    """LayerNorm statistics, softmax and reductions get fp32 inputs; convs and linears half."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    cast, _ = cast_graph(_fused(ViTLike().eval(), x), [x], "fp16")
    seen: dict[str, set[torch.dtype]] = {}

    def record(name):
        def hook(module, inputs, output):
            seen.setdefault(name, set()).add(inputs[0].dtype)

        return hook

    for name, module in cast.named_modules():
        if "layer_norm" in name or "linear" in name or "conv" in name:
            module.register_forward_hook(record(name))
    with torch.no_grad():
        cast(x)
    assert seen and all(
        dtypes == ({torch.float32} if "layer_norm" in name or "head" in name else {torch.float16})
        for name, dtypes in seen.items()
    ), seen


def test_rms_norm_takes_fp32_and_a_linear_after_it_reads_its_dtype() -> None:
    """``torch.rms_norm`` (Dynamo's ``nn.RMSNorm``) is a normalisation: fp32 statistics. Not
    known here, it was taken to follow its inputs (fp32, with its fp32 weight) while it gave
    the half dtype of its input: the fp32 head read fp16 (mat1 and mat2 must have the same
    dtype), and the fp16 artifact was refused."""

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.norm, self.head = nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return self.head(torch.rms_norm(h, (32,), self.norm.weight, 1e-6))

    torch.manual_seed(0)
    model, x = Norm().eval(), torch.randn(4, 16)
    with torch.no_grad():
        cast, layers = cast_graph(_fused(model, x), [x], "fp16")
        got, expected = cast(x), model(x)
    assert {r["id"].split("@")[0]: r["precision"] for r in layers}["rms_norm"] == "fp32"
    assert got.dtype == torch.float32 and _cosine(got, expected) > 0.999


def test_the_onnx_file_carries_fp16_types(tmp_path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    cast, _ = cast_graph(_fused(SmallNet().eval(), x), [x], "fp16")
    path = export_onnx(cast, [x], tmp_path / "half.onnx")
    model = onnx.load(str(path))
    types = {i.data_type for i in model.graph.initializer if len(i.dims) >= 2}
    assert onnx.TensorProto.FLOAT16 in types  # conv/linear weights stored half
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    to = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}  # precision changes, not the masks
    casts = sum(n.op_type == "Cast" and n.attribute[0].i in to for n in model.graph.node)
    assert 1 <= casts <= 6


def test_fp16_through_torch_compile_runs_on_onnxruntime(tmp_path) -> None:
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(
        model,
        backend="embedl_tensorrt",
        options={
            "precision": "fp16",
            "cache_dir": str(tmp_path),
            "fallback": "raise",
            "runtime": "onnxruntime",
        },
    )
    with torch.no_grad():
        expected, got = model(x), compiled(x)
    sub = embedl_dynamo.last_report().subgraphs[0]
    assert sub.runtime == "onnxruntime" and not sub.reason
    assert sub.pipeline["precision"] == "fp16"
    assert {r["precision"] for r in sub.pipeline["layers"]} == {"fp16", "fp32"}
    assert _cosine(got, expected) > 0.999


def test_bf16_onnxruntime_cannot_run_falls_back_to_fp32_with_a_warning(tmp_path, caplog) -> None:
    """ONNX Runtime's CPU provider has no bf16 Conv: the float artifact runs, and it is said."""
    torch.manual_seed(0)
    model = SmallNet().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(
        model,
        backend="embedl_tensorrt",
        options={"precision": "bf16", "cache_dir": str(tmp_path), "runtime": "onnxruntime"},
    )
    with torch.no_grad(), caplog.at_level("WARNING"):
        expected, got = model(x), compiled(x)
    assert "bf16 onnxruntime artifact rejected" in caplog.text
    sub = embedl_dynamo.last_report().subgraphs[0]
    assert sub.runtime == "onnxruntime" and sub.reason.startswith("bf16 rejected, fp32 runs")
    assert (got - expected).abs().max().item() < 1e-5


def test_fp16_export_writes_half_types_and_lists_every_layer_precision(tmp_path) -> None:
    from embedl_dynamo.deploy.export import export, sidecar_path
    from embedl_dynamo.deploy.load import load

    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(2, 3, 32, 32)
    path = export(model, x, tmp_path / "m.onnx", precision="fp16", progress=False)
    side = json.loads(sidecar_path(path).read_text())
    assert side["precision"] == "fp16" and side["verification"]["passed"]
    assert side["verification"]["compared_with"] == "fp16 PyTorch graph"
    assert side["verification"]["cosine_to_float"] > 0.999
    assert {r["precision"] for r in side["layers"]} == {"fp16", "fp32"}
    assert all(r["reason"] for r in side["layers"])
    initializers = onnx.load(str(path)).graph.initializer
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in initializers)
    with torch.no_grad():
        assert _cosine(load(path)(x), model(x)) > 0.999


def test_cli_export_takes_precision(tmp_path) -> None:
    from embedl_dynamo.cli.main import main

    code = main(
        [
            "export",
            "tests.models:MobileNetLike",
            "--input-shape",
            "1,3,32,32",
            "-o",
            str(tmp_path / "m.onnx"),
            "--precision",
            "fp16",
            "-q",
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "m.json").read_text())["precision"] == "fp16"
    assert (
        main(
            [
                "export",
                "tests.models:MobileNetLike",
                "--input-shape",
                "1,3,32,32",
                "-o",
                str(tmp_path / "n.onnx"),
                "--precision",
                "fp16",
                "--int8",
                "-q",
            ]
        )
        == 2
    )


class _ProjectedQuery(nn.Module):
    """Attention whose query comes from a linear (half) and whose key and value are inputs
    (fp32), with an additive float mask: q, k and v must reach the attention in one dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, x, k, v, mask):
        heads = self.q(x).unflatten(-1, (2, 8)).transpose(1, 2)
        attended = F.scaled_dot_product_attention(heads, k, v, attn_mask=mask)
        return self.out(attended.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_attention_inputs_are_cast_together(precision) -> None:
    torch.manual_seed(0)
    model = _ProjectedQuery().eval()
    k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.zeros(2, 1, 5, 5)
    mask[..., -1] = torch.finfo(torch.float32).min  # HF's padding mask, in float32
    args = (torch.randn(2, 5, 16), k, v, mask)
    fused = _fused(model, *args)
    assert any(type(m).__name__ == "FusedAttention" for m in fused.modules())
    cast, layers = cast_graph(fused, list(args), precision)
    with torch.no_grad():
        out = cast(*args)
        expected = model(*args)
    assert out.dtype == torch.float32
    assert _cosine(out, expected) > 0.99
    attention = [r for r in layers if "attention" in r["id"].lower()]
    assert attention and all(r["precision"] == precision for r in attention), layers
