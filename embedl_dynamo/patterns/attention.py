"""Attention fusions of the ``tensorrt`` target and the modules they create.

* ``layer_norm``: one LayerNorm node becomes :class:`FusedLayerNorm` (TensorRT's normalization
  kernel; kept in high precision, so it declares no QDQ of its own: the Linear after it
  quantizes its input).
* ``mha_in_projection``: the three Q/K/V linears that read the same input and feed
  :func:`~embedl_dynamo.graph.attention_forms.split_heads` become one :class:`FusedQKVProjection`:
  one GEMM with ``W = [Wq; Wk; Wv]``, ``b = [bq; bk; bv]``, split into q, k, v heads.
* ``scaled_dot_product_attention``: ``softmax(q k^T * scale) v`` becomes :class:`FusedAttention`
  (TensorRT's fused MHA kernel).

How one anchor expresses a three-output fusion: the matcher walks a tree backwards from a single
anchor, so the attention decomposition emits ``split_heads(q, k, v, H)``, a small leaf function
(``torch.fx.wrap``) whose three inputs are the projections. Anchoring on it, the pattern is a
plain tree ``split_heads(linear(x), linear(x), linear(x))``; the fused module returns the same
tuple, so the ``getitem`` readers stay as they are. Anchoring on the SDPA instead would put the
SDPA inside this match and make it overlap the ``scaled_dot_product_attention`` fusion.

QDQ (TensorRT explicit quantization): the inputs of every GEMM/MatMul are quantized (the
projection's input and per-channel weight; the attention's q, k and v, the operands of its two
batched matmuls). Whether attention runs in INT8 (head size, sequence length) is decided by the
quantization stage.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.attention_forms import split_heads
from embedl_dynamo.patterns.attention_export import (
    attention_for_export,
    attention_probs,
    mask_in_dtype_of,
)
from embedl_dynamo.patterns.fused_modules import frozen_parameter
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = [
    "ATTENTION_FUSION_PATTERNS",
    "AttentionProbs",
    "FusedAttention",
    "FusedLayerNorm",
    "FusedQKVProjection",
    "LayerNorm",
    "MHAInProjection",
    "ScaledDotProductAttention",
]

torch.fx.wrap("split_heads")  # a leaf in pattern targets, as in decomposed graphs


# ---------------------------------------------------------------------------------------------
# fused modules
# ---------------------------------------------------------------------------------------------


class FusedLayerNorm(FusedModule):
    """LayerNorm over the last dims: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    No QDQ: TensorRT keeps normalization in high precision.
    """

    qdq = QDQ()

    def __init__(
        self,
        normalized_shape: tuple[int, ...],
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
    ) -> None:
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.weight, self.bias, self.eps = frozen_parameter(weight), frozen_parameter(bias), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class FusedQKVProjection(FusedModule):
    """One GEMM computing q, k and v, split into heads: ``split_heads(*(x W^T + b).split(...))``.

    Quantized as: the input (activation) and the concatenated weight (per output channel).
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION}, weights={"weight": Role.WEIGHT})

    def __init__(
        self,
        weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
        num_heads: int,
    ) -> None:
        super().__init__()
        self.sizes = [w.shape[0] for w in weights]
        self.weight = frozen_parameter(torch.cat(weights))
        if all(b is None for b in biases):
            self.bias = None
        else:
            filled = [
                b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)
            ]
            self.bias = frozen_parameter(torch.cat(filled))
        self.num_heads = num_heads

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        return split_heads(q, k, v, self.num_heads)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}->{'+'.join(map(str, self.sizes))}, heads={self.num_heads}"


class FusedAttention(FusedModule):
    """``softmax(q k^T * scale + mask) v`` on ``(N, H, L, D)`` heads: one kernel.

    The mask is causal (``is_causal``), or an optional fourth input: a boolean mask (True
    attends) or an additive float mask broadcastable to ``(N, H, L, S)``, as HF models pass
    for padding. A float mask follows the heads' dtype, clamped to its finite range first, so a
    float32 ``finfo.min`` mask stays finite under FP16 and a fully masked row gives a uniform
    average instead of NaN, as in float32.

    Quantized as: q, k and v (the operands of the two batched matmuls); the mask stays float.

    ``num_heads`` (from the query's shape when the fusion knew it) is metadata for kernels that
    take heads as an attribute (ONNX Runtime's MultiHeadAttention); the math does not use it.
    ``groups > 1``: grouped-query attention, k and v with ``num_heads / groups`` heads, each
    read by ``groups`` query heads (:func:`attention_for_export`); the mask is one head.
    ``head_sizes``: the query/key and the value head size, where the fusion knew them as
    numbers; with ``num_heads``, the export regroups the heads by constant shapes.
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION, "1": Role.ACTIVATION, "2": Role.ACTIVATION})

    def __init__(
        self,
        is_causal: bool = False,
        scale: float | None = None,
        num_heads: int | None = None,
        groups: int = 1,
        head_sizes: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.is_causal, self.scale = is_causal, scale
        self.num_heads, self.groups, self.head_sizes = num_heads, groups, head_sizes

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        attn_mask = mask_in_dtype_of(q, attn_mask)
        if torch.onnx.is_in_onnx_export():
            known = self.num_heads is not None and self.head_sizes is not None
            heads = (self.num_heads, *self.head_sizes) if known else None
            args = (attn_mask, self.is_causal, self.scale, self.groups, heads)
            return attention_for_export(q, k, v, *args)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=self.is_causal,
            scale=self.scale,
            enable_gqa=self.groups > 1,
        )

    def extra_repr(self) -> str:
        grouped = f", groups={self.groups}" if self.groups > 1 else ""
        return f"is_causal={self.is_causal}, scale={self.scale}{grouped}"


class AttentionProbs(FusedModule):
    """``softmax(q k^T * scale + mask)``: the first half of :class:`FusedAttention`, for
    targets that quantize the attention probabilities before ``probs @ v`` (TensorRT's INT8
    attention reads Q/DQ on q, k, the softmax output and v). Always in the export form
    (:func:`attention_for_export`), so q's and k's DequantizeLinear feed the MatMul.

    Quantized as: q and k.
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION, "1": Role.ACTIVATION})

    def __init__(self, is_causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.is_causal, self.scale = is_causal, scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return attention_probs(q, k, mask_in_dtype_of(q, attn_mask), self.is_causal, self.scale)

    def extra_repr(self) -> str:
        return f"is_causal={self.is_causal}, scale={self.scale}"


# ---------------------------------------------------------------------------------------------
# patterns
# ---------------------------------------------------------------------------------------------


class LayerNorm(Pattern):
    """One LayerNorm node becomes :class:`FusedLayerNorm`."""

    name = "layer_norm"
    phase = "fusion"
    id_node = "norm"
    qdq = QDQ()

    @staticmethod
    def target(x, w, b):
        norm = F.layer_norm(x, (8,), w, b)
        return norm, {"norm": norm}

    def check(self, m: Match) -> MatchResult:
        if not m.all_constant("w", "b"):
            return m.fail("layer norm weight or bias is not a constant")
        kw = m["norm"].kwargs
        if not isinstance(kw["eps"], float) or isinstance(kw["normalized_shape"], fx.Node):
            return m.fail("eps or normalized_shape is not a literal (a graph input)")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        kw = m["norm"].kwargs
        module = FusedLayerNorm(kw["normalized_shape"], m.value("w"), m.value("b"), kw["eps"])
        return m.call_module(module, m["x"])


class MHAInProjection(Pattern):
    """The Q/K/V linears of one attention, reading the same input, become one GEMM."""

    name = "mha_in_projection"
    phase = "fusion"
    id_node = "heads"
    qdq = QDQ(
        inputs={"xq": Role.ACTIVATION},
        weights={"wq": Role.WEIGHT, "wk": Role.WEIGHT, "wv": Role.WEIGHT},
    )

    @staticmethod
    def target(xq, wq, bq, xk, wk, bk, xv, wv, bv):
        q = F.linear(xq, wq, bq)
        k = F.linear(xk, wk, bk)
        v = F.linear(xv, wv, bv)
        heads = split_heads(q, k, v, 2)
        return heads, {"q": q, "k": k, "v": v, "heads": heads}

    def check(self, m: Match) -> MatchResult:
        if not (m["xq"] is m["xk"] is m["xv"]):
            return m.fail("q, k and v projections read different inputs (cross-attention)")
        if not m.all_constant("wq", "bq", "wk", "bk", "wv", "bv"):
            return m.fail("projection weights are not constants")
        widths = {m.value(w).shape[1] for w in ("wq", "wk", "wv")}
        if len(widths) != 1:
            return m.fail(f"projection input widths differ: {sorted(widths)}")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        weights = tuple(m.value(w) for w in ("wq", "wk", "wv"))
        biases = tuple(m.value(b) for b in ("bq", "bk", "bv"))
        num_heads = m["heads"].args[3]
        return m.call_module(FusedQKVProjection(weights, biases, num_heads), m["xq"])


class ScaledDotProductAttention(Pattern):
    """``F.scaled_dot_product_attention`` becomes :class:`FusedAttention`.

    An attention mask (padding or causal, as a tensor) becomes the fused module's fourth input,
    so masked attention in HF encoders and decoders is fused and quantized like unmasked.
    Dropout (training only) and grouped-query attention are not fused."""

    name = "scaled_dot_product_attention"
    phase = "fusion"
    id_node = "sdpa"
    qdq = QDQ(inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION})

    @staticmethod
    def target(q, k, v):
        sdpa = F.scaled_dot_product_attention(q, k, v)
        return sdpa, {"sdpa": sdpa}

    def check(self, m: Match) -> MatchResult:
        kw = m["sdpa"].kwargs
        mask = kw["attn_mask"]
        if mask is not None and not isinstance(mask, fx.Node):
            return m.fail(f"attn_mask is a literal {type(mask).__name__}, not a tensor")
        if mask is not None and kw["is_causal"]:
            return m.fail("both attn_mask and is_causal are given")
        if kw["dropout_p"]:
            return m.fail(f"dropout_p={kw['dropout_p']} (attention dropout is training only)")
        if kw["enable_gqa"]:
            return m.fail("grouped-query attention (enable_gqa=True) is not fused")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        kw = m["sdpa"].kwargs
        shape = m.shape("q")
        heads = shape[1] if shape is not None and len(shape) == 4 else None
        module = FusedAttention(
            is_causal=bool(kw["is_causal"]),
            scale=kw["scale"],
            num_heads=heads if isinstance(heads, int) else None,
        )
        mask = () if kw["attn_mask"] is None else (kw["attn_mask"],)
        return m.call_module(module, m["q"], m["k"], m["v"], *mask)


ATTENTION_FUSION_PATTERNS = (MHAInProjection(), ScaledDotProductAttention(), LayerNorm())
