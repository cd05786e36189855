"""Weight-only integer codes: how one linear weight is stored and read back.

A ``[N, K]`` weight gets integer codes ``q``, scales ``s`` and, when asymmetric, zero points
``z``: per output channel for 8 bits, per group of ``g`` consecutive input features for 4 bits::

    symmetric:   s = max|W| / qmax,        q = clip(round(W / s), -qmax, qmax),   z = 0
    asymmetric:  s = (max(W, 0) - min(W, 0)) / (2**bits - 1),  z = round(-min(W, 0) / s),
                 q = clip(round(W / s) + z, 0, 2**bits - 1)
    W' = (q - z) * s                      (qmax = 7 for int4, 127 for int8: a narrow range)

:mod:`embedl_dynamo.quant.weight_only.linear` turns linear layers into such codes;
:mod:`embedl_dynamo.onnx.weight_only` writes them to the ONNX file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["WeightOnlySpec", "dequantize_weight", "dequantize_weight_t", "quantize_weight"]


@dataclass(frozen=True)
class WeightOnlySpec:
    """How one weight is stored.

    Attributes:
        bits: 8 (per output channel) or 4 (per group of ``group_size`` input features).
        group_size: input features per scale (4 bits only): a power of two from 16 to 256, the
            block sizes ONNX Runtime's ``MatMulNBits`` takes (32 to 128 are the usual ones).
        symmetric: zero points all 0 (TensorRT's quantization is symmetric), else a zero point
            per scale (one more level of range for weights that are not centred).
    """

    bits: int
    group_size: int = 128
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"invalid weight-only bits={self.bits!r}; expected 4 or 8")
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 16 or g > 256 or g & (g - 1):
            raise ValueError(
                f"invalid weight_only_group_size={g!r}; expected a power of two from 16 to 256 "
                "(32, 64 or 128 are usual)"
            )
        if not isinstance(self.symmetric, bool):
            raise ValueError(f"invalid weight_only_symmetric={self.symmetric!r}; True or False")

    def group(self, in_features: int) -> int:
        """The input features per scale for a weight with ``in_features`` columns."""
        return self.group_size if self.bits == 4 else in_features


def quantize_weight(
    weight: torch.Tensor, spec: WeightOnlySpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(q, s, z)`` of a ``[N, K]`` weight under ``spec`` (see the module's formulas).

    Returns:
        ``q`` int8 ``[N, K]`` (codes in the signed or unsigned range of ``spec.bits``), ``s``
        float32 ``[N, K // group]``, ``z`` uint8 like ``s`` (None when symmetric).

    Raises:
        ValueError: the weight is not 2-d, or ``K`` is not a multiple of the group.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight-only quantization takes a 2-d weight, not {tuple(weight.shape)}")
    n, k = weight.shape
    group = spec.group(k)
    if k % group:
        raise ValueError(f"in_features {k} is not a multiple of weight_only_group_size {group}")
    w = weight.detach().float().reshape(n, k // group, group)
    # one float temporary the size of the weight (an LLM's output head is 0.5 GB): in place
    if spec.symmetric:
        qmax = 2 ** (spec.bits - 1) - 1
        scale = (w.abs().amax(-1) / qmax).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.div(w, scale[..., None]).round_().clamp_(-qmax, qmax)
        return q.to(torch.int8).reshape(n, k), scale, None
    levels = 2**spec.bits - 1
    low, high = w.amin(-1).clamp_max(0), w.amax(-1).clamp_min(0)
    scale = ((high - low) / levels).clamp_min(torch.finfo(torch.float32).tiny)
    zero = torch.clamp(torch.round(-low / scale), 0, levels)
    q = torch.div(w, scale[..., None]).round_().add_(zero[..., None]).clamp_(0, levels)
    return q.to(torch.uint8).reshape(n, k), scale, zero.to(torch.uint8)


def dequantize_weight(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """``W' = (q - z) * s``, float32 ``[N, K]``."""
    n, k = q.shape
    groups = scale.shape[1]
    codes = q.float().reshape(n, groups, k // groups)  # the one float temporary: in place
    if zero is not None:
        codes.sub_(zero.float()[..., None])
    return codes.mul_(scale[..., None]).reshape(n, k)


def dequantize_weight_t(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """``W'.T``, float32 ``[K, N]`` and contiguous: the same numbers as
    ``dequantize_weight(q, scale, zero).t().contiguous()``, with the integer codes transposed
    (a quarter of the bytes to move) rather than the float weight."""
    n, k = q.shape
    groups = scale.shape[1]
    codes = q.t().contiguous().float().reshape(groups, k // groups, n)
    if zero is not None:
        codes.sub_(zero.t().float()[:, None, :])
    return codes.mul_(scale.t()[:, None, :]).reshape(k, n)
