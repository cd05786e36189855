"""ExpandGroupedKeyValue: SDPA with enable_gqa=True as multi-head SDPA over repeated K/V."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.patterns.grouped_query import ExpandGroupedKeyValue


class _Attention(nn.Module):
    def __init__(self, gqa: bool) -> None:
        super().__init__()
        self.gqa = gqa

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)


def _qkv(kv_heads: int = 2):
    torch.manual_seed(0)
    return torch.randn(2, 6, 5, 8), torch.randn(2, kv_heads, 5, 8), torch.randn(2, kv_heads, 5, 8)


def _plan(model, args):
    return embedl_dynamo.get_transformation_plan(model, [ExpandGroupedKeyValue()], args)


def test_grouped_query_attention_matches():
    entries = _plan(_Attention(gqa=True), _qkv()).entries
    applied = [e for e in entries if e.apply]
    assert [e.pattern.name for e in applied] == ["expand_grouped_kv"]
    # the SDPA it wrote is plain multi-head attention: seen again, and declined
    assert [e.reason for e in entries if not e.apply] == [
        "not grouped-query attention (enable_gqa is False)"
    ]


def test_plain_attention_is_not_rewritten_and_says_why():
    q, _, _ = _qkv()
    (entry,) = _plan(_Attention(gqa=False), (q, q, q)).entries
    assert not entry.apply
    assert entry.reason == "not grouped-query attention (enable_gqa is False)"


def test_the_rewrite_computes_the_same_attention():
    args = _qkv()
    model = _Attention(gqa=True)
    result = embedl_dynamo.transform(model, args, [ExpandGroupedKeyValue()])
    assert not any(n.kwargs.get("enable_gqa") for n in result.model.graph.nodes)
    torch.testing.assert_close(result.model(*args), model(*args), rtol=0, atol=1e-6)


def test_grouped_query_attention_compiles_on_the_runtime(compile_isolation):
    """Regression (issue 24): "conversion of scaled_dot_product_attention not implemented if
    enable_gqa is True" sent every Llama/Qwen2/Mistral/Phi-3 subgraph to PyTorch."""
    model = _Attention(gqa=True)
    args = _qkv()
    with torch.no_grad():
        options = {"min_subgraph_size": 1}
        got = torch.compile(model, backend="embedl_onnxruntime", options=options)(*args)
        torch.testing.assert_close(got, model(*args), rtol=0, atol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime", sub.reason


# -- grouped_query_attention: the onnxruntime target fuses it over the K/V heads themselves ----


def _onnxruntime_patterns():
    from embedl_dynamo.backend import backend_by_name

    backend = backend_by_name("onnxruntime")
    return [*backend.conversion_patterns, *backend.fusion_patterns]


class _MaskedAttention(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def test_grouped_attention_is_fused_over_the_kv_heads_themselves(tmp_path):
    from embedl_dynamo.onnx.export import export_onnx
    from embedl_dynamo.patterns.attention import FusedAttention

    onnx = pytest.importorskip("onnx")
    args = _qkv()
    model = _Attention(gqa=True)
    result = embedl_dynamo.transform(model, args, _onnxruntime_patterns())
    applied = [e.pattern.name for e in result.plan.entries if e.apply]
    assert applied.count("grouped_query_attention") == 1, result.plan
    (fused,) = [m for m in result.model.modules() if isinstance(m, FusedAttention)]
    assert (fused.groups, fused.num_heads, fused.head_sizes) == (3, 6, (8, 8))
    torch.testing.assert_close(result.model(*args), model(*args), rtol=0, atol=1e-6)
    path = export_onnx(result.model, list(args), tmp_path / "gqa.onnx")
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "Tile" not in ops and "Expand" not in ops and ops.count("MatMul") == 2, ops


@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool"])
def test_the_grouped_export_form_is_grouped_query_attention(mask):
    from embedl_dynamo.patterns.attention_export import attention_for_export

    q, k, v = _qkv()
    keep = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) > 0.3
    masks = {
        "none": None,
        "causal": None,
        "bool": keep,
        "float": torch.zeros(2, 1, 5, 5).masked_fill(~keep, -1e9),
    }
    causal = mask == "causal"
    got = attention_for_export(q, k, v, masks[mask], causal, None, groups=3)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=masks[mask], is_causal=causal, enable_gqa=True
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_a_mask_per_head_keeps_the_repeated_kv_and_says_why():
    q, k, v = _qkv()
    per_head = torch.zeros(2, 6, 5, 5)
    entries = embedl_dynamo.get_transformation_plan(
        _MaskedAttention(), _onnxruntime_patterns(), (q, k, v, per_head)
    ).entries
    (grouped,) = [e for e in entries if e.pattern.name == "grouped_query_attention"]
    assert not grouped.apply and grouped.reason.startswith("the mask is not one head")
    assert [e.apply for e in entries if e.pattern.name == "scaled_dot_product_attention"] == [True]


def _constant_inputs(graph, node):
    """The values of ``node``'s inputs that are initializers or Constant nodes."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for constant in (n for n in graph.node if n.op_type == "Constant"):
        values[constant.output[0]] = numpy_helper.to_array(constant.attribute[0].t)
    return [values[name].tolist() for name in node.input if name in values]


def test_the_grouped_export_regroups_heads_with_constant_shapes(tmp_path):
    """Each regrouping of the query heads is one Reshape whose shape is a constant (0 keeps the
    batch, -1 is the length): no shape arithmetic runs on a call, and other batches and
    lengths give SDPA's numbers."""
    from embedl_dynamo.graph.dynamic_axes import DynamicAxes
    from embedl_dynamo.onnx.export import export_onnx

    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    args = _qkv()
    model = _Attention(gqa=True)
    result = embedl_dynamo.transform(model, args, _onnxruntime_patterns())
    dynamic = {0: "batch", 2: "length"}
    axes = DynamicAxes(inputs=(dynamic, dynamic, dynamic), outputs=(dynamic,))
    path = export_onnx(result.model, list(args), tmp_path / "gqa.onnx", dynamic_axes=axes)
    graph = onnx.load(str(path)).graph
    assert "Div" not in [n.op_type for n in graph.node]  # no heads // groups in the graph
    reshapes = [n for n in graph.node if n.op_type == "Reshape"]
    assert [_constant_inputs(graph, n) for n in reshapes] == [[[0, 2, 3, -1, 8]], [[0, 6, -1, 8]]]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 6, 7, 8), torch.randn(3, 2, 7, 8), torch.randn(3, 2, 7, 8)
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (q, k, v))}
    (got,) = session.run(None, feeds)
    torch.testing.assert_close(torch.from_numpy(got), model(q, k, v), rtol=0, atol=1e-5)


class _GroupByDynamicWidth(nn.Module):
    def forward(self, x):
        from embedl_dynamo.patterns.attention_export import reshape_keeping_batch

        return reshape_keeping_batch(x * 2, ((0, 1, 2), 2, -1))


def test_a_regrouping_that_reads_a_dynamic_size_computes_its_shape_in_the_graph(tmp_path):
    """Where a size the shape reads is dynamic in the export, it is read from ``Shape`` (a
    constant would hold the example's size)."""
    from embedl_dynamo.graph.dynamic_axes import DynamicAxes
    from embedl_dynamo.onnx.export import export_onnx

    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = _GroupByDynamicWidth()
    gm = torch.fx.symbolic_trace(model)
    axes = DynamicAxes(inputs=({0: "batch", 1: "width"},), outputs=({0: "batch", 1: "half"},))
    path = export_onnx(gm, [torch.randn(2, 4, 3, 5)], tmp_path / "g.onnx", dynamic_axes=axes)
    assert "Shape" in [n.op_type for n in onnx.load(str(path)).graph.node]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 6, 3, 5)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), (x * 2).reshape(3, 3, 2, 15))
    assert torch.equal(model(x), (x * 2).reshape(3, 3, 2, 15))
