"""Attention written out op by op becomes one ``scaled_dot_product_attention``.

transformers' ``eager`` attention (Llama, Qwen2, Mistral, Phi-3, GPT-2, BERT with
``attn_implementation="eager"``) and many hand-written models compute::

    probs = softmax(q @ k^T * scale [+ mask], dim=-1);   out = probs @ v

which is ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)`` exactly: SDPA
adds a float mask to the scaled scores before the softmax, as here. As SDPA it is fused like
every other attention (:class:`~embedl_dynamo.patterns.attention.ScaledDotProductAttention`),
so it runs as one attention and is quantized on q, k and v. Keys and values that ``repeat_kv``
expanded for grouped-query attention stay the inputs, as they are for SDPA after ``repeat_kv``.

The rewrite declines where the two differ: a softmax over another axis or in a wider type than
the scores (SDPA would compute it in the scores' type), a transpose that is not of k's last two
axes, a scale that is a tensor, a mask that is not a float tensor or would broadcast the scores to
a larger shape (SDPA takes only masks broadcastable to the scores), and attention probabilities
read elsewhere (``output_attentions``: the matcher keeps them).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import copy_meta, node_shape, node_value_meta
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["EXPLICIT_ATTENTION_PATTERNS", "ExplicitAttention"]


def _masked_target(q, k, v, scale, mask):
    key_t = k.transpose(-2, -1)
    scores = torch.matmul(q, key_t)
    scaled = scores * scale
    masked = scaled + mask
    probs = F.softmax(masked, dim=-1)
    out = torch.matmul(probs, v)
    return out, {"key_t": key_t, "scores": scores, "with_mask": masked, "probs": probs, "out": out}


def _unmasked_target(q, k, v, scale):
    key_t = k.transpose(-2, -1)
    scores = torch.matmul(q, key_t)
    scaled = scores * scale
    probs = F.softmax(scaled, dim=-1)
    out = torch.matmul(probs, v)
    return out, {"key_t": key_t, "scores": scores, "probs": probs, "out": out}


def _dtype(node: object) -> torch.dtype | None:
    value = node_value_meta(node) if isinstance(node, fx.Node) else None
    return getattr(value, "dtype", None)


def _swaps_last_two(node: fx.Node, rank: int) -> bool:
    dims = [*node.args[1:], *node.kwargs.values()]
    if len(dims) != 2 or not all(isinstance(d, int) for d in dims):
        return False
    return sorted(d % rank for d in dims) == [rank - 2, rank - 1]


class ExplicitAttention(Pattern):
    """``softmax(q k^T * scale [+ mask]) v`` becomes ``F.scaled_dot_product_attention``.

    One class, two instances: ``explicit_attention_masked`` (a float mask added to the scaled
    scores, as HF's eager attention adds its causal / padding mask) and ``explicit_attention``.

    Args:
        name: the pattern name (plan ids ``<name>@<module path>``).
        masked: whether the target adds a mask to the scaled scores.
    """

    phase = "conversion"
    id_node = "out"

    def __init__(self, name: str, masked: bool) -> None:
        self.name = name
        self.masked = masked
        self.target = _masked_target if masked else _unmasked_target

    def check(self, m: Match) -> MatchResult:
        q, k, v = m.shape("q"), m.shape("k"), m.shape("v")
        if q is None or k is None or v is None:
            return m.fail("query, key or value shape is unknown (trace with example inputs)")
        if not (len(q) == len(k) == len(v) >= 2):
            return m.fail(f"query, key and value ranks differ ({len(q)}, {len(k)}, {len(v)})")
        if not _swaps_last_two(m["key_t"], len(k)):
            return m.fail("the transpose does not swap the key's last two axes")
        dtypes = {_dtype(m[name]) for name in ("q", "k", "v", "probs")}
        if len(dtypes) != 1 or not getattr(next(iter(dtypes)), "is_floating_point", False):
            return m.fail("query, key, value and probabilities are not of one float type")
        softmax = m["probs"].kwargs
        if softmax["dim"] not in (-1, len(q) - 1):
            return m.fail(f"softmax over axis {softmax['dim']}, not the keys' axis")
        if softmax.get("dtype") not in (None, _dtype(m["q"])):
            return m.fail(f"softmax computed in {softmax['dtype']}, wider than the scores")
        scale = m["scale"]
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            return m.fail("the scale is a tensor, not a number")
        if self.masked:
            mask = _dtype(m["mask"])
            if mask is None or not mask.is_floating_point:
                return m.fail(f"the mask is not a float tensor ({mask})")
            scores, masked = m.shape("scores"), node_shape(m["with_mask"])
            if scores is None or masked is None or tuple(masked) != tuple(scores):
                return m.fail("the mask broadcasts the scores to another shape")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        mask = m["mask"] if self.masked else None
        out = m.call(
            F.scaled_dot_product_attention,
            query=m["q"],
            key=m["k"],
            value=m["v"],
            attn_mask=mask,
            scale=float(m["scale"]),
        )
        infer_meta(m.gm, [out])
        copy_meta(m.anchor, out)
        return out


EXPLICIT_ATTENTION_PATTERNS = (
    ExplicitAttention("explicit_attention_masked", masked=True),
    ExplicitAttention("explicit_attention", masked=False),
)
