"""ExpandGroupedKeyValue: SDPA with enable_gqa=True as multi-head SDPA over repeated K/V."""

from __future__ import annotations

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
