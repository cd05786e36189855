"""Grouped-query attention as multi-head attention: the K/V heads repeated for their groups.

``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with ``Hq`` query heads and
``Hkv`` key/value heads (``Hq = g * Hkv``) lets query head ``h`` attend with key/value head
``h // g``. Repeating every K/V head ``g`` times along the head axis,
``k' = repeat_interleave(k, g, dim=-3)`` (and ``v'`` alike), gives the same attention as plain
multi-head SDPA: ``softmax(q_h k'_h^T * scale) v'_h = softmax(q_h k_{h//g}^T * scale) v_{h//g}``.
The ONNX exporter has no conversion for ``enable_gqa`` (Llama, Qwen2, Mistral and Phi-3 in
transformers 5 call SDPA so), and the fused attention patterns then match the plain form, as
they match older models' ``repeat_kv`` written out by hand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import copy_meta
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["GROUPED_QUERY_PATTERNS", "ExpandGroupedKeyValue"]


class ExpandGroupedKeyValue(Pattern):
    """SDPA with ``enable_gqa=True`` becomes SDPA over K/V heads repeated for their groups."""

    name = "expand_grouped_kv"
    phase = "conversion"
    id_node = "sdpa"

    @staticmethod
    def target(q, k, v):
        sdpa = F.scaled_dot_product_attention(q, k, v)
        return sdpa, {"sdpa": sdpa}

    def check(self, m: Match) -> MatchResult:
        if not m["sdpa"].kwargs.get("enable_gqa"):
            return m.fail("not grouped-query attention (enable_gqa is False)")
        q, k, v = m.shape("q"), m.shape("k"), m.shape("v")
        if q is None or k is None or v is None:
            return m.fail("query, key or value shape is unknown (trace with example inputs)")
        if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
            return m.fail(f"query/key/value ranks differ or lack a head axis ({len(q)}, {len(k)})")
        heads, kv_heads = q[-3], k[-3]
        if not (isinstance(heads, int) and isinstance(kv_heads, int)) or v[-3] != kv_heads:
            return m.fail("head counts are symbolic or key and value differ")
        if kv_heads == 0 or heads % kv_heads:
            return m.fail(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        groups = m.shape("q")[-3] // m.shape("k")[-3]
        created = []
        repeated = {}
        for name in ("k", "v"):
            repeated[name] = m[name]
            if groups > 1:
                with m.graph.inserting_before(m.anchor):
                    node = m.graph.call_function(
                        torch.repeat_interleave, (m[name], groups), {"dim": -3}
                    )
                copy_meta(m[name], node)
                created.append(node)
                repeated[name] = node
        kwargs = {**m["sdpa"].kwargs, "query": m["q"], "key": repeated["k"]}
        out = m.call(F.scaled_dot_product_attention, **{**kwargs, "value": repeated["v"],
                                                       "enable_gqa": False})  # fmt: skip
        infer_meta(m.gm, [*created, out])
        copy_meta(m.anchor, out)
        return out


GROUPED_QUERY_PATTERNS = (ExpandGroupedKeyValue(),)
