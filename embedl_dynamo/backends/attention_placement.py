"""Attention placement rules (phase ``quantized``): which attention operands get Q/DQ.

* TensorRT's fused INT8 attention takes q, k and v quantized, for head sizes in
  :data:`TENSORRT_ATTENTION_HEAD_SIZES` (otherwise the attention stays float):
  :class:`QuantAttention` (``nn.MultiheadAttention``), :class:`QuantSDPA` and
  :class:`QuantFusedAttention`.
  Before annotation, :class:`SplitAttentionForTensorRT` splits such an attention into
  ``AttentionProbs(q, k) -> matmul(probs, v)``, so the softmax output gets a Q/DQ of its own:
  TensorRT's INT8 attention reads Q/DQ on q, k, the probabilities and v, as NVIDIA ModelOpt
  places them (the probabilities module and the matmul are quantized by the target's generic
  fused-module and activation-matmul rules).
* OpenVINO's CPU plugin runs ``q k^T`` in INT8 inside its fused attention for any head size and
  keeps ``softmax(.) v`` float: :class:`QuantFusedAttention` with q and k only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.nodes import PATH_KEY, canonical_call, module_path, node_shape
from embedl_dynamo.patterns.attention import (
    AttentionProbs,
    FusedAttention,
    ScaledDotProductAttention,
)
from embedl_dynamo.quant.int8.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = [
    "TENSORRT_ATTENTION_HEAD_SIZES",
    "QuantAttention",
    "QuantFusedAttention",
    "QuantSDPA",
    "SplitAttentionForTensorRT",
]

TENSORRT_ATTENTION_HEAD_SIZES = (16, 32, 64)


def _head_size_reason(head_dim: Any) -> str:
    if head_dim not in TENSORRT_ATTENTION_HEAD_SIZES:
        return (
            f"attention head size {head_dim} is not in {list(TENSORRT_ATTENTION_HEAD_SIZES)}: "
            "TensorRT's fused INT8 attention does not apply"
        )
    return ""


class QuantAttention(PlacementRule):
    """TensorRT: nn.MultiheadAttention with quantized input and projection weights."""

    name = "quant_attention"
    qdq = QDQ(
        inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION},
        weights={"w_in": Role.WEIGHT, "w_out": Role.WEIGHT},
    )

    @staticmethod
    def target(q, k, v, embed_dim, num_heads, w_in, b_in, w_out, b_out):
        out = F.multi_head_attention_forward(
            q, k, v, embed_dim, num_heads, w_in, b_in, None, None, False, 0.0, w_out, b_out
        )
        return out, {"mha": out}

    def check(self, m: Match) -> MatchResult:
        embed_dim, heads = m.kwarg("mha", "embed_dim_to_check"), m.kwarg("mha", "num_heads")
        if not isinstance(embed_dim, int) or not isinstance(heads, int):
            return m.fail("attention sizes are not static")
        reason = _head_size_reason(embed_dim // heads)
        if reason:
            return m.fail(reason)
        if not m.all_constant("w_in", "w_out"):
            return m.fail("attention projection weights are not constants")
        return m.ok()


class QuantSDPA(PlacementRule):
    """TensorRT: scaled-dot-product attention with quantized Q, K, V (head size permitting)."""

    name = "quant_sdpa"
    qdq = QDQ(inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION})

    target = staticmethod(ScaledDotProductAttention.target)  # the fused span it quantizes

    def check(self, m: Match) -> MatchResult:
        shape = m.shape("q")
        if shape is None:
            return m.fail("query shape unknown")
        reason = _head_size_reason(int(shape[-1]))
        return m.fail(reason) if reason else m.ok()


class QuantFusedAttention(PlacementRule):
    """Fused attention with quantized operands.

    TensorRT quantizes q, k and v when the head size suits its fused INT8 kernel. OpenVINO's
    CPU plugin runs ``q k^T`` in INT8 inside its fused attention for any head size and keeps
    ``softmax(.) v`` float, so only q and k are quantized there (NNCF's transformer placement).

    Args:
        name: the rule name.
        operands: which of q (``"0"``), k (``"1"``) and v (``"2"``) are quantized.
        head_sizes: the head sizes the target's INT8 attention takes (None: any).
    """

    module_types = (FusedAttention,)

    def __init__(
        self,
        name: str = "quant_fused_attention",
        operands: tuple[str, ...] = ("0", "1", "2"),
        head_sizes: tuple[int, ...] | None = TENSORRT_ATTENTION_HEAD_SIZES,
    ) -> None:
        self.name = name
        self.operands = tuple(operands)
        self.head_sizes = head_sizes

    def module_qdq(self, module: FusedModule, node: fx.Node) -> QDQ:
        return QDQ(inputs={i: r for i, r in module.qdq.inputs.items() if i in self.operands})

    def check_module(self, module: FusedModule, node: fx.Node) -> str:
        if self.head_sizes is None:
            return ""
        shape = node_shape(node.args[0]) if node.args else None
        if shape is None:
            return "attention head size unknown (no shape metadata)"
        return _head_size_reason(int(shape[-1]))


class SplitAttentionForTensorRT(PreparationRewrite):
    """TensorRT: a fused attention whose head size its INT8 kernel takes becomes
    ``AttentionProbs(q, k[, mask])`` followed by ``matmul(probs, v)``: the same math, with the
    softmax output a value of its own to quantize. Other head sizes stay fused (and float)."""

    name = "split_attention_for_tensorrt"

    def rewrite_module(self, gm: fx.GraphModule, node: fx.Node, module: nn.Module) -> bool:
        if not isinstance(module, FusedAttention) or len(node.args) < 3:
            return False
        shape = node_shape(node.args[0])
        if shape is None or _head_size_reason(int(shape[-1])):
            return False
        name = f"{node.target}_probs"
        gm.add_module(name, AttentionProbs(module.is_causal, module.scale))
        path = module_path(node)
        q, k, v, *mask = node.args
        with gm.graph.inserting_before(node):
            probs = gm.graph.call_module(name, (q, k, *mask))
            probs.meta[PATH_KEY] = path
            out = canonical_call(gm.graph, torch.matmul, path=path, input=probs, other=v)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        return True
