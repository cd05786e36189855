"""Modules that fusions put in the graph: one module per hardware kernel.

Each folds what it can into its weights at construction (BatchNorm into the convolution) and
declares in ``qdq`` where Quantize/DequantizeLinear pairs go around it, following TensorRT's
explicit-quantization rules: the activation inputs of a Conv/Linear (both branches of a residual
add) and the weight per output channel, never inside the fused group, because TensorRT and ONNX
Runtime run the group as one kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = [
    "ACTIVATIONS",
    "FusedAdaptiveAvgPool",
    "FusedConv",
    "FusedConvAdd",
    "FusedConvMaxPool",
    "FusedLinear",
    "activation_name",
    "fold_batch_norm",
    "frozen_parameter",
]

# canonical activation target -> name used in module reprs and ids
ACTIVATIONS: dict[Callable[..., torch.Tensor], str] = {
    torch.relu: "relu",
    F.relu6: "relu6",
    F.silu: "silu",
    F.hardswish: "hardswish",
    F.hardsigmoid: "hardsigmoid",
    F.gelu: "gelu",
}

_ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def activation_name(node: fx.Node) -> str | None:
    """The fused-module name of a canonical activation node (``gelu_tanh`` for tanh GELU).

    Returns None when ``node`` is not an activation a fused module can run.
    """
    name = ACTIVATIONS.get(node.target) if node.op == "call_function" else None
    if name == "gelu":
        approximate = node.kwargs.get("approximate", "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return name


def _check_activation(activation: str | None) -> None:
    if activation is not None and activation not in _ACTIVATION_FNS:
        raise ValueError(f"unknown activation {activation!r}; known: {sorted(_ACTIVATION_FNS)}")


def frozen_parameter(tensor: torch.Tensor | None) -> nn.Parameter | None:
    """``tensor`` as a fused module's parameter that takes no gradient (None stays None).

    A model's parameter (``nn.Parameter``, or a tensor that requires grad: ``prepare_qat``
    trains the fused copy) is copied, so training the fused module never writes the model's
    own weights. A frozen constant (a compile's graph, where the weights are plain tensors) or
    a tensor a fusion computed is shared, not copied: an LLM's weights would otherwise exist
    twice while it compiles. Passes that write a fused module's weights in place (SmoothQuant,
    the int8 stage) work on their own ``deepcopy`` of the graph.
    """
    if tensor is None:
        return None
    if isinstance(tensor, nn.Parameter) or tensor.requires_grad:
        return nn.Parameter(tensor.detach().clone(), requires_grad=False)
    return nn.Parameter(tensor.detach(), requires_grad=False)


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
        _check_activation(activation)
        self.weight = frozen_parameter(weight)
        self.bias = frozen_parameter(bias)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation
        self.kind = kind
        self._conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[weight.dim()]

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )

    def _activate(self, y: torch.Tensor) -> torch.Tensor:
        if self.activation is not None:
            y = _ACTIVATION_FNS[self.activation](y)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._activate(self._convolve(x))

    def extra_repr(self) -> str:
        out_ch, in_ch = self.weight.shape[:2]
        act = f", activation={self.activation}" if self.activation else ""
        return f"{in_ch * self.groups}->{out_ch}, kernel={tuple(self.weight.shape[2:])}{act}"


class FusedConvMaxPool(FusedConv):
    """A network stem: convolution (BatchNorm folded), activation, then 2-d max pooling.

    Quantized like :class:`FusedConv`: the max pool reads the activation inside the group.
    """

    def __init__(self, *conv_args: Any, pool: dict[str, Any], **conv_kwargs: Any) -> None:
        super().__init__(*conv_args, **conv_kwargs)
        self.pool = dict(pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(self._activate(self._convolve(x)), **self.pool)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, maxpool={self.pool['kernel_size']}"


class FusedConvAdd(FusedConv):
    """Convolution (BatchNorm folded) plus a residual, then an optional activation.

    ``forward(x, residual) = act(conv(x) + residual)``. The conv's input and the residual are
    quantized; the conv's output stays inside the group, so TensorRT fuses the add into the
    convolution (Q/DQ on the skip input only, as NVIDIA ModelOpt places it too).
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION, "1": Role.ACTIVATION}, weights={"weight": Role.WEIGHT})

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self._activate(self._convolve(x) + residual)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, residual"


class FusedLinear(FusedModule):
    """``act(x @ w.T + b)``: a fully connected layer with an optional activation.

    Quantized as: the input (activation role) and the weight (per output feature).
    """

    qdq = QDQ(inputs={"0": Role.ACTIVATION}, weights={"weight": Role.WEIGHT})

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        kind: str = "linear",
    ) -> None:
        super().__init__()
        _check_activation(activation)
        self.weight = frozen_parameter(weight)
        self.bias = frozen_parameter(bias)
        self.activation = activation
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.activation is not None:
            y = _ACTIVATION_FNS[self.activation](y)
        return y

    def extra_repr(self) -> str:
        out_f, in_f = self.weight.shape
        act = f", activation={self.activation}" if self.activation else ""
        return f"{in_f}->{out_f}{act}"


class FusedAdaptiveAvgPool(FusedModule):
    """2-d adaptive average pooling with its input quantized (TensorRT runs INT8 pooling)."""

    qdq = QDQ(inputs={"0": Role.ACTIVATION})

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
