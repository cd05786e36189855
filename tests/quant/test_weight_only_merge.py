"""Weight-only layers that read one input, stored as one
(:mod:`embedl_dynamo.quant.weight_only.merge`): which layers merge and why others do not, the
graph it leaves, the numbers (the unmerged layers' own), and the one kernel per group that
ONNX Runtime runs."""

from __future__ import annotations

import collections
import copy

import expecttest
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.quant.weight_only.codes import WeightOnlySpec
from embedl_dynamo.quant.weight_only.linear import weight_only_graph
from embedl_dynamo.quant.weight_only.merge import MergedWeightOnlyLinear, merge_sibling_layers
from embedl_dynamo.quant.weight_only.stage import weight_only_stage
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.runtimes.onnxruntime.session import create_session
from embedl_dynamo.settings import Settings

pytestmark = pytest.mark.usefixtures("compile_isolation")


class Block(nn.Module):
    """q/k/v on one input (biased), gate (silu) and up on another (no bias), a biased side
    linear beside them, a down projection alone, and a head that reads the same input as the
    gate and up but comes last (so, without a budget, it keeps 8 bits)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 64), nn.Linear(64, 32), nn.Linear(64, 32)
        self.gate = nn.Linear(64, 128, bias=False)
        self.up = nn.Linear(64, 128, bias=False)
        self.side = nn.Linear(64, 64)
        self.down = nn.Linear(128, 64, bias=False)
        self.head = nn.Linear(64, 40, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.q(x) + torch.cat([self.k(x), self.v(x)], -1)
        y = self.down(F.silu(self.gate(h)) * self.up(h)) + self.side(h)
        return y, self.head(h)


def _x() -> torch.Tensor:
    return torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))


def _fused() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    plan = plan_transformation(Block().eval(), patterns, args=(_x(),))
    return apply_transformation_plan(plan).model


@pytest.fixture(scope="module")
def quantized():
    """The int4 graph before merging (group 32, no budget: the head keeps 8 bits)."""
    graph, report = weight_only_graph(_fused(), [_x()], WeightOnlySpec(4, group_size=32))
    return graph, report


def _merged(quantized) -> tuple[torch.fx.GraphModule, list[list[str]]]:
    graph = copy.deepcopy(quantized[0])
    return graph, merge_sibling_layers(graph)


class MergedGraph(expecttest.TestCase):
    def test_siblings_of_one_form_become_one_layer_and_a_split(self) -> None:
        graph, report = weight_only_graph(_fused(), [_x()], WeightOnlySpec(4, group_size=32))
        merged = merge_sibling_layers(graph)
        self.assertExpectedInline(
            format_graph(graph),
            """\
input x
linear_q_merged = MergedWeightOnlyLinear(x)
getitem = getitem(linear_q_merged, 0)
getitem_1 = getitem(linear_q_merged, 1)
getitem_2 = getitem(linear_q_merged, 2)
cat = cat([getitem_1, getitem_2], -1)
add_2 = add(input=getitem, other=cat)
linear_silu_gate_merged = MergedWeightOnlyLinear(add_2)
getitem_3 = getitem(linear_silu_gate_merged, 0)
getitem_4 = getitem(linear_silu_gate_merged, 1)
mul_1 = mul(input=getitem_3, other=getitem_4)
linear_down = WeightOnlyLinear(mul_1)
linear_side = WeightOnlyLinear(add_2)
add_3 = add(input=linear_down, other=linear_side)
linear_head = WeightOnlyLinear(add_2)
return (add_3, linear_head)""",
        )
        # q, k, v: one input, all biased, int4; gate (silu) and up: one input, no bias, int4
        self.assertEqual(
            merged,
            [
                ["linear@q", "linear@k", "linear@v"],
                ["linear_silu@gate", "linear@up"],
            ],
        )
        layer = graph.get_submodule("linear_silu_gate_merged")
        self.assertEqual((layer.sizes, layer.activations), ([128, 128], ["silu", None]))
        # the layer ids the report gives per linear are unchanged
        self.assertEqual(len(report["layers"]), 8)


def test_a_side_layer_with_a_bias_and_the_8_bit_head_stay_apart(quantized):
    """``side`` reads the gate's input but has a bias (a merged bias would add zeros to the
    others); ``head`` reads it too but keeps 8 bits (the last linear, no budget)."""
    graph, report = quantized
    precisions = {r["id"]: r["precision"] for r in report["layers"]}
    assert precisions["linear@head"] == "int8_weight_only"
    merged_graph, merged = _merged(quantized)
    together = {layer_id for group in merged for layer_id in group}
    assert not {"linear@side", "linear@head", "linear@down"} & together
    kinds = collections.Counter(type(m).__name__ for m in merged_graph.modules())
    assert kinds["MergedWeightOnlyLinear"] == 2 and kinds["WeightOnlyLinear"] == 3


def test_a_graph_without_siblings_is_left_as_it_is():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    gm = apply_transformation_plan(plan_transformation(model, patterns, args=(_x(),))).model
    graph, _ = weight_only_graph(gm, [_x()], WeightOnlySpec(8))
    before = format_graph(graph)
    assert merge_sibling_layers(graph) == []
    assert format_graph(graph) == before


@pytest.mark.parametrize("bits", [4, 8])
def test_merged_layers_give_the_unmerged_layers_numbers(bits):
    graph, _ = weight_only_graph(_fused(), [_x()], WeightOnlySpec(bits, group_size=32))
    with torch.no_grad():
        expected = graph(_x())
        merge_sibling_layers(graph)
        assert any(isinstance(m, MergedWeightOnlyLinear) for m in graph.modules())
        merged = graph(_x())
    for got, want in zip(merged, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_stage_reports_the_groups_and_onnxruntime_runs_one_kernel_each(tmp_path):
    """With a budget the head is tried in int4 too, and then joins gate and up."""
    ort = pytest.importorskip("onnxruntime")
    settings = Settings(
        precision="int4_weight_only", weight_only_group_size=32, accuracy_budget=0.01
    )
    graph, entries = weight_only_stage(_fused(), [_x()], as_backend("onnxruntime"), settings)
    assert entries["weight_only"]["merged"] == [
        ["linear@q", "linear@k", "linear@v"],
        ["linear_silu@gate", "linear@up", "linear@head"],
    ]
    path = export_onnx(graph, [_x()], tmp_path / "block.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    options.log_severity_level = 3
    session = create_session(path, ["CPUExecutionProvider"], options=options)
    ops = collections.Counter(
        n.op_type for n in onnx.load(str(tmp_path / "optimised.onnx")).graph.node
    )
    # qkv, gate+up+head, side, down: four weight-only kernels for eight linears
    assert ops["MatMulNBits"] == 4 and not ops["DequantizeLinear"], ops
    with torch.no_grad():
        expected = [t.numpy() for t in graph(_x())]
    outputs = session.run(None, {session.get_inputs()[0].name: _x().numpy()})
    for got, want in zip(outputs, expected):
        cosine = float(np.dot(got.ravel(), want.ravel()))
        cosine /= float(np.linalg.norm(got) * np.linalg.norm(want))
        assert cosine > 0.999  # int8 compute also quantizes the activations: close, not equal


def test_the_tensorrt_lint_accepts_a_merged_symmetric_int4_file(tmp_path):
    """The merged weights are still blocked int4 read only as a MatMul weight, split after."""
    from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt

    settings = Settings(precision="int4_weight_only", weight_only_group_size=32)
    graph, entries = weight_only_stage(_fused(), [_x()], as_backend("tensorrt"), settings)
    assert entries["weight_only"]["symmetric"] and entries["weight_only"]["merged"]
    path = export_onnx(graph, [_x()], tmp_path / "block.onnx")
    model = onnx.load(str(path))
    assert "Split" in {n.op_type for n in model.graph.node}
    assert lint_for_tensorrt(model) == []


def test_openvino_runs_a_decoders_merged_weights_as_compressed_fully_connected_layers():
    """Through ``torch.compile``: each of a Qwen2 layer's q/k/v and gate/up groups is one
    int4 compressed ``FullyConnected`` on OpenVINO's CPU plugin, like the single layers."""
    from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
    from tests.helpers import DECODER_VOCAB, tiny_decoder

    if not OpenVINORuntime.is_available():
        pytest.skip(OpenVINORuntime.missing())
    model = tiny_decoder("qwen2", 2)
    ids = torch.randint(0, DECODER_VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    options = {
        "precision": "int4_weight_only",
        "weight_only_group_size": 32,
        "accuracy_budget": 0.5,
        "fallback": "raise",
    }
    compiled = torch.compile(model, backend="embedl_openvino", options=options)
    with torch.no_grad():
        expected, out = model(ids).logits, compiled(ids).logits
    (subgraph,) = embedl_dynamo.last_report().subgraphs
    layers = model.config.num_hidden_layers
    assert len(subgraph.pipeline["weight_only"]["merged"]) == 2 * layers  # qkv, gate+up
    # o, down, qkv, gate+up per layer, and the head
    assert subgraph.runtime_info["int4_layers"] == {"FullyConnected": 4 * layers + 1}
    cosine = F.cosine_similarity(out.flatten(), expected.flatten(), 0).item()
    assert cosine > 0.95
