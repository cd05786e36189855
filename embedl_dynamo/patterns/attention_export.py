"""The attention of :class:`~embedl_dynamo.patterns.attention.FusedAttention` written out op
by op, as the ONNX file carries it.

Grouped-query attention regroups the query heads, ``(N, Hq, L, D) -> (N, Hkv, groups, L, D)``,
and back. Written with sizes read from the tensor, the TorchScript exporter computes each target
shape in the graph (``Shape``, ``Gather``, ``Unsqueeze``, ``Div``, ``Concat``: fourteen small
nodes per attention, which a runtime executes on every decode step, since the batch axis is
dynamic). :func:`reshape_keeping_batch` exports each as one ``Reshape`` with a constant shape
instead: ``0`` (ONNX: copy this axis of the input) for the batch, ``-1`` for the length, the
head counts and sizes as numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.onnx import symbolic_helper

__all__ = [
    "attention_for_export",
    "attention_probs",
    "fully_masked",
    "mask_in_dtype_of",
    "reshape_keeping_batch",
]


#: a size in :func:`reshape_keeping_batch`'s tail: a number, ``(source, axis)``, or
#: ``(source, axis, divisor)`` (that size divided by ``divisor``)
Size = int | tuple[int, int] | tuple[int, int, int]


class _ReshapeKeepingBatch(torch.autograd.Function):
    """``x.reshape(x.shape[0], *tail)``; exported as ``Reshape(x, [0, *tail])``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tail: Sequence[Size], *others: torch.Tensor) -> Any:
        return _reshaped(x, tail, others)

    @staticmethod
    def symbolic(g: Any, x: Any, tail: Sequence[Size], *others: Any) -> Any:
        shapes = [symbolic_helper._get_tensor_sizes(t) or [] for t in (x, *others)]
        try:
            static = [_resolve(size, shapes) for size in tail]
        except (IndexError, TypeError):  # a size the tail reads is not static in the export
            static = None
        if static is not None and all(isinstance(s, int) for s in static):
            shape = g.op("Constant", value_t=torch.tensor([0, *static], dtype=torch.int64))
            return g.op("Reshape", x, shape)
        return _dynamic_reshape(g, x, tail, others)


def _reshaped(x: torch.Tensor, tail: Sequence[Size], others: Sequence[torch.Tensor]) -> Any:
    shapes = [t.shape for t in (x, *others)]
    return x.reshape(x.shape[0], *(_resolve(size, shapes) for size in tail))


def _resolve(size: Size, shapes: Sequence[Sequence[Any]]) -> Any:
    if isinstance(size, int):
        return size
    value = shapes[size[0]][size[1]]
    return value // size[2] if len(size) == 3 else value


def _dynamic_reshape(g: Any, x: Any, tail: Sequence[Size], others: Sequence[Any]) -> Any:
    """As :class:`_ReshapeKeepingBatch`, the sizes the tail reads taken from ``Shape``."""

    def constant(value: int) -> Any:
        return g.op("Constant", value_t=torch.tensor([value], dtype=torch.int64))

    parts = [constant(0)]
    for size in tail:
        if isinstance(size, int):
            parts.append(constant(size))
            continue
        shape = g.op("Shape", (x, *others)[size[0]])
        part = g.op("Gather", shape, constant(size[1]), axis_i=0)
        parts.append(g.op("Div", part, constant(size[2])) if len(size) == 3 else part)
    return g.op("Reshape", x, g.op("Concat", *parts, axis_i=0))


def reshape_keeping_batch(
    x: torch.Tensor, tail: Sequence[Size], *others: torch.Tensor
) -> torch.Tensor:
    """``x.reshape(x.shape[0], *tail)``: the batch axis kept, ``tail`` the other sizes.

    A tail entry is a number (``-1`` for at most one), or a size of ``x`` or of ``others``:
    ``(source, axis)`` with source 0 for ``x`` and 1, 2, ... for ``others``, or ``(source,
    axis, divisor)`` for that size divided by ``divisor``. In an ONNX export the result is one
    ``Reshape`` whose shape is a constant, ``[0, ...]``, where every size the tail reads is
    static in the exported graph (as head counts and head sizes are); else those sizes are read
    from ``Shape``.
    """
    if torch.onnx.is_in_onnx_export():
        return _ReshapeKeepingBatch.apply(x, tuple(tail), *others)
    return _reshaped(x, tail, others)


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    zero_masked_rows: bool = True,
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask)`` op by op: the MatMul reads q and k^T, the scale
    follows it (see :func:`attention_for_export`). As in ``scaled_dot_product_attention``, a
    boolean mask's fully masked rows give zeros and an additive mask is added as it is (a row
    it masks by ``-inf`` everywhere gives zeros, unless ``zero_masked_rows`` is False)."""
    factor = scale if scale is not None else float(q.shape[-1]) ** -0.5
    scores = torch.matmul(q, k.transpose(-2, -1)) * factor
    low = torch.finfo(scores.dtype).min
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, low)
    if attn_mask is None:
        return torch.softmax(scores, dim=-1)
    if attn_mask.dtype != torch.bool:
        probs = torch.softmax(scores + attn_mask, dim=-1)
        # a query whose every key is masked by -inf gets zeros, as scaled_dot_product_attention
        # gives (a plain softmax gives NaN); attention_for_export zeroes its output instead
        return probs.masked_fill(fully_masked(attn_mask), 0.0) if zero_masked_rows else probs
    probs = torch.softmax(scores.masked_fill(~attn_mask, low), dim=-1)
    # a query whose every key is masked gets zeros, as scaled_dot_product_attention gives
    return probs * attn_mask.any(dim=-1, keepdim=True).to(probs.dtype)


def fully_masked(attn_mask: torch.Tensor) -> torch.Tensor:
    """Which queries an additive float mask masks by ``-inf`` at every key (``(..., L, 1)``):
    ``scaled_dot_product_attention`` gives them zeros where a softmax gives NaN."""
    return attn_mask.eq(float("-inf")).all(dim=-1, keepdim=True)


def attention_for_export(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    groups: int = 1,
    heads: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` written out op by op, as the ONNX file carries it.

    The exporter's own ``scaled_dot_product_attention`` multiplies q and k by ``sqrt(scale)``
    each before their MatMul, so a DequantizeLinear of q or k never reaches the MatMul:
    TensorRT cannot fuse an INT8 ``q k^T`` (NVIDIA ModelOpt places Q/DQ right before it), and
    OpenVINO keeps a FakeQuantize per head unfused. Here the MatMul reads q and k^T directly and
    the scale follows it (``MatMul -> Mul -> Add -> Softmax -> MatMul``, the form ONNX Runtime's
    and OpenVINO's attention fusions match). Boolean masks become the dtype's lowest finite
    value where False, so no row turns to NaN.

    ``groups > 1``: grouped-query attention without repeating K and V. Query head ``h`` of
    ``(N, Hq, L, D)`` attends with key/value head ``h // groups`` of ``(N, Hq / groups, S, D)``:
    the query heads are grouped, ``(N, Hkv, groups, L, D)``, and K and V get a broadcast axis,
    ``(N, Hkv, 1, S, D)``, so each MatMul reads a key/value head once for its whole group
    instead of a copy per query head (``repeat_interleave``: a ``Tile`` of the cache on every
    decode step). A mask of one head broadcasts over the group. ``heads``: the query head
    count and the query/key and value head sizes as numbers (the fusion's), so the export
    regroups by constant shapes (:func:`reshape_keeping_batch`).
    """
    if groups == 1:
        out = torch.matmul(attention_probs(q, k, attn_mask, is_causal, scale, False), v)
        if attn_mask is not None and attn_mask.is_floating_point():
            # zeros for a query whose every key is masked by -inf, as PyTorch gives: on the
            # output, so the Softmax -> MatMul the runtimes' attention fusions match stays
            out = out.masked_fill(fully_masked(attn_mask), 0.0)
        return out
    # (N, Hq, L, D) -> (N, Hkv, groups, L, D), and back
    if heads is not None:
        num_heads, depth, value_depth = heads
        into, back = (num_heads // groups, groups, -1, depth), (num_heads, -1, value_depth)
    else:  # read from the tensors: constant where the export's shapes know them
        into, back = ((0, 1, groups), groups, -1, (0, 3)), ((1, 1), -1, (2, 3))
    grouped = reshape_keeping_batch(q, into)
    mask = attn_mask.unsqueeze(-3) if attn_mask is not None else None
    out = attention_for_export(grouped, k.unsqueeze(-3), v.unsqueeze(-3), mask, is_causal, scale)
    return reshape_keeping_batch(out, back, q, v)


def mask_in_dtype_of(q: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """An additive float mask in q's dtype, clamped to its range first (a float32 -3.4e38
    "minus infinity" would overflow fp16 to -inf and turn fully masked rows into NaN)."""
    if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != q.dtype:
        attn_mask = attn_mask.clamp(min=torch.finfo(q.dtype).min).to(q.dtype)
    return attn_mask
