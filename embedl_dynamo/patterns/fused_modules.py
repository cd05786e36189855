"""Modules that fusions put in the graph: one module per hardware kernel.

Each folds what it can into its weights at construction (BatchNorm into the convolution) and
declares in ``qdq`` where Quantize/DequantizeLinear pairs go around it: its activation inputs
and its weight, never inside the fused group, because TensorRT and ONNX Runtime run the group
as one kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..pattern import QDQ, FusedModule, Role

__all__ = ["ACTIVATIONS", "FusedConv", "fold_batch_norm"]

# canonical activation target -> name used in module reprs and ids
ACTIVATIONS: dict[Callable[..., torch.Tensor], str] = {
    torch.relu: "relu",
    F.relu6: "relu6",
    F.silu: "silu",
    F.hardswish: "hardswish",
    F.gelu: "gelu",
}

_ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
}


def fold_batch_norm(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm into the preceding convolution (or linear) layer.

    ``w' = w * g / sqrt(var + eps)`` per output channel and
    ``b' = (b - mean) * g / sqrt(var + eps) + beta``, computed in float64 so the fused layer
    matches the unfused one to float32 rounding.
    """
    dtype = weight.dtype
    w, m, v = weight.double(), mean.double(), var.double()
    g = gamma.double() if gamma is not None else torch.ones_like(m)
    be = beta.double() if beta is not None else torch.zeros_like(m)
    b = bias.double() if bias is not None else torch.zeros_like(m)
    scale = g / torch.sqrt(v + eps)
    fused_w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    fused_b = (b - m) * scale + be
    return fused_w.to(dtype), fused_b.to(dtype)


class FusedConv(FusedModule):
    """Convolution with BatchNorm folded in and an optional activation: one kernel.

    Quantized as: the input (activation role) and the weight (per output channel).
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION}, weights={"weight": Role.WEIGHT})

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride,
        padding,
        dilation,
        groups: int,
        activation: str | None = None,
        kind: str = "conv_bn",
    ) -> None:
        super().__init__()
        if activation is not None and activation not in _ACTIVATION_FNS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(_ACTIVATION_FNS)}")
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = (
            nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        )
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation
        self.kind = kind
        self._conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[weight.dim()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._conv(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )
        if self.activation is not None:
            y = _ACTIVATION_FNS[self.activation](y)
        return y

    def extra_repr(self) -> str:
        out_ch, in_ch = self.weight.shape[:2]
        act = f", activation={self.activation}" if self.activation else ""
        return f"{in_ch * self.groups}->{out_ch}, kernel={tuple(self.weight.shape[2:])}{act}"
