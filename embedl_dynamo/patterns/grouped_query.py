"""Grouped-query attention as multi-head attention: the K/V heads repeated for their groups.

``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with ``Hq`` query heads and
``Hkv`` key/value heads (``Hq = g * Hkv``) lets query head ``h`` attend with key/value head
``h // g``. Repeating every K/V head ``g`` times along the head axis,
``k' = repeat_interleave(k, g, dim=-3)`` (and ``v'`` alike), gives the same attention as plain
multi-head SDPA: ``softmax(q_h k'_h^T * scale) v'_h = softmax(q_h k_{h//g}^T * scale) v_{h//g}``.
The ONNX exporter has no conversion for ``enable_gqa`` (Llama, Qwen2, Mistral and Phi-3 in
transformers 5 call SDPA so), and the fused attention patterns then match the plain form, as
they match older models' ``repeat_kv`` written out by hand.

``grouped_query_attention`` (the ``onnxruntime`` target's fusion) then takes that SDPA over
repeated K/V, ``SDPA(q, repeat_interleave(k, g), repeat_interleave(v, g))``, as one
:class:`~embedl_dynamo.patterns.attention.FusedAttention` with ``groups=g`` over the K/V heads
themselves: the same attention, whose ONNX form broadcasts each K/V head over its group
instead of copying it ``g`` times (a ``Tile`` of the whole cache on every decode step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.meta import infer_meta, set_meta_shape
from embedl_dynamo.graph.nodes import copy_meta, node_shape
from embedl_dynamo.patterns.attention import FusedAttention, ScaledDotProductAttention
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = ["GROUPED_QUERY_PATTERNS", "ExpandGroupedKeyValue", "GroupedQueryAttention"]


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
        repeated = {}
        for name in ("k", "v"):
            repeated[name] = m[name]
            if groups > 1:
                with m.graph.inserting_before(m.anchor):
                    node = m.graph.call_function(
                        torch.repeat_interleave, (m[name], groups), {"dim": -3}
                    )
                copy_meta(m[name], node)
                shape = list(m.shape(name))
                shape[-3] *= groups
                set_meta_shape(node, m[name], shape)
                repeated[name] = node
        kwargs = {**m["sdpa"].kwargs, "query": m["q"], "key": repeated["k"]}
        out = m.call(
            F.scaled_dot_product_attention,
            **{**kwargs, "value": repeated["v"], "enable_gqa": False},
        )
        infer_meta(m.gm, [out])
        copy_meta(m.anchor, out)
        return out


_PLAIN_ATTENTION = ScaledDotProductAttention()


class GroupedQueryAttention(Pattern):
    """SDPA over K/V heads repeated for their groups becomes one grouped
    :class:`~embedl_dynamo.patterns.attention.FusedAttention` over the heads themselves."""

    name = "grouped_query_attention"
    phase = "fusion"
    id_node = "sdpa"
    qdq = QDQ(inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION})

    @staticmethod
    def target(q, k, v, groups):
        key = torch.repeat_interleave(k, groups, dim=-3)
        value = torch.repeat_interleave(v, groups, dim=-3)
        sdpa = F.scaled_dot_product_attention(q, key, value)
        return sdpa, {"key": key, "value": value, "sdpa": sdpa}

    def check(self, m: Match) -> MatchResult:
        plain = _PLAIN_ATTENTION.check(m)  # mask, dropout, is_causal: as for any SDPA
        if not plain:
            return plain
        groups, q, k = m["groups"], m.shape("q"), m.shape("k")
        if any(m[name].kwargs.get("dim") != -3 for name in ("key", "value")):
            return m.fail("K/V are not repeated along the head axis (dim=-3)")
        if not isinstance(groups, int) or groups < 2:
            return m.fail(f"repeats {groups!r} are not a number of query heads per K/V head")
        if q is None or k is None or len(q) != 4 or len(k) != 4:
            return m.fail("query or key is not (N, H, L, D) with known sizes")
        if not (isinstance(q[1], int) and isinstance(k[1], int)) or q[1] != k[1] * groups:
            return m.fail(f"{q[1]} query heads are not {groups} x {k[1]} key/value heads")
        mask = m["sdpa"].kwargs["attn_mask"]
        if mask is None:
            return m.ok()
        shape = node_shape(mask)
        if shape is None:
            return m.fail("the mask's shape is unknown (trace with example inputs)")
        if not (len(shape) == 2 or (len(shape) == 4 and shape[1] == 1)):
            return m.fail("the mask is not one head, (N, 1, L, S) or (L, S)")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        kw, sizes = m["sdpa"].kwargs, (m.shape("q")[-1], m.shape("v")[-1])
        static = all(isinstance(size, int) for size in sizes)
        module = FusedAttention(
            is_causal=bool(kw["is_causal"]),
            scale=kw["scale"],
            num_heads=m.shape("q")[1],
            groups=m["groups"],
            head_sizes=sizes if static else None,
        )
        mask = () if kw["attn_mask"] is None else (kw["attn_mask"],)
        return m.call_module(module, m["q"], m["k"], m["v"], *mask)


GROUPED_QUERY_PATTERNS = (ExpandGroupedKeyValue(),)
