"""ONNX Runtime's transformer optimizer as a step of the onnxruntime runtime: which graphs go
through it, that the fused graph holds fused attention kernels (counted), and that it matches."""

from __future__ import annotations

import onnx
import torch
from onnx import helper

import embedl_dynamo
from embedl_dynamo.runtimes.onnxruntime.transformer_fusion import has_attention
from tests.models import ResNetLike, ViTLike, randomize_batchnorm


def _graph(ops: list[tuple[str, list[str], list[str]]]) -> onnx.ModelProto:
    nodes = [helper.make_node(op, inputs, outputs) for op, inputs, outputs in ops]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [value("a", 1, [2, 2]), value("b", 1, [2, 2])], [value("y", 1, [2, 2])]
    )
    return helper.make_model(graph)


def test_attention_is_a_softmax_fed_by_a_matmul_in_a_float_graph() -> None:
    attention = _graph([("MatMul", ["a", "b"], ["s"]), ("Div", ["s", "b"], ["d"]),
                        ("Softmax", ["d"], ["p"]), ("MatMul", ["p", "b"], ["y"])])  # fmt: skip
    assert has_attention(attention)
    assert not has_attention(_graph([("Relu", ["a"], ["r"]), ("Softmax", ["r"], ["y"])]))
    quantized = _graph([("QuantizeLinear", ["a", "b"], ["q"]), ("MatMul", ["q", "b"], ["s"]),
                        ("Softmax", ["s"], ["y"])])  # fmt: skip
    assert not has_attention(quantized)  # the optimizer's fusions are float patterns


def _compile(model, x, tmp_path, **options):
    compiled = torch.compile(
        model, backend="embedl_onnxruntime", options={"cache_dir": str(tmp_path), **options}
    )
    with torch.no_grad():
        return compiled(x), model(x)


def test_transformer_gets_onnxruntime_fused_kernels_and_matches(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = ViTLike().eval(), torch.randn(2, 3, 16, 16)
    got, want = _compile(model, x, tmp_path, transformer_fusion=True)
    (sub,) = embedl_dynamo.last_report().subgraphs
    fusions = sub.runtime_info.get("ort_fusions", {})
    assert fusions.get("BiasGelu") == 2, fusions  # one per MLP block
    assert fusions.get("MultiHeadAttention") == 2, fusions  # our attention, one kernel each
    embedl_dynamo.wait_for_cache_writes()
    fused = onnx.load(sub.runtime_info["artifact"], load_external_data=False)
    for op in ("BiasGelu", "MultiHeadAttention"):  # in the file ONNX Runtime loads, not only
        assert sum(n.op_type == op for n in fused.graph.node) == 2  # reported
    assert (got - want).abs().max().item() < 1e-4


def test_fusion_is_opt_in_and_cnns_never_go_through_it(tmp_path) -> None:
    torch.manual_seed(0)
    _compile(ViTLike().eval(), torch.randn(2, 3, 16, 16), tmp_path)
    assert "ort_fusions" not in embedl_dynamo.last_report().subgraphs[0].runtime_info
    embedl_dynamo.report.clear_reports()
    _compile(randomize_batchnorm(ResNetLike().eval()), torch.randn(1, 3, 16, 16), tmp_path,
             transformer_fusion=True)  # fmt: skip
    assert "ort_fusions" not in embedl_dynamo.last_report().subgraphs[0].runtime_info


def test_the_head_count_is_read_only_when_the_fused_file_is_built(tmp_path) -> None:
    """Reading the heads may run the graph: a cached fused file needs none of it."""
    from embedl_dynamo.runtimes.onnxruntime.transformer_fusion import fused_artifact

    torch.manual_seed(0)
    _compile(ViTLike().eval(), torch.randn(2, 3, 16, 16), tmp_path)
    embedl_dynamo.wait_for_cache_writes()
    sub = embedl_dynamo.last_report().subgraphs[0]
    path, key = sub.runtime_info["artifact"], sub.runtime_info["key"]
    nodes = onnx.load(path, load_external_data=False).graph.node
    scopes = {n.name.split("/")[2] for n in nodes if "scaled_dot_product_attention" in n.name}
    assert len(scopes) == 2, scopes  # one attention module per block
    calls = []

    def heads() -> dict[str, int]:
        calls.append(1)
        return dict.fromkeys(scopes, 2)

    first = fused_artifact(path, key, tmp_path, heads)
    second = fused_artifact(path, key, tmp_path, heads)
    assert first is not None and first == second
    assert first[1]["MultiHeadAttention"] == 2
    assert len(calls) == 1
