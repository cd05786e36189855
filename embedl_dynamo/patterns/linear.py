"""Fusions of a fully connected layer: ``act(linear(x, w, b))`` and the bare ``linear``.

TensorRT runs the matrix multiply, bias and activation as one kernel (and ONNX Runtime as
``Gemm`` + activation); the fused module declares TensorRT's QDQ: the input and the weight per
output feature. One pattern per activation keeps plan ids readable (``linear_gelu@mlp.0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.activation_fusion import ActivationFusion
from embedl_dynamo.patterns.fused_modules import FusedLinear
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = [
    "LINEAR",
    "LINEAR_GELU",
    "LINEAR_HARDSWISH",
    "LINEAR_PATTERNS",
    "LINEAR_QDQ",
    "LINEAR_RELU",
    "LINEAR_SILU",
    "LinearActivation",
    "check_linear",
    "linear_target",
]

LINEAR_QDQ = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})


def check_linear(m: Match) -> MatchResult:
    """The weight and bias must be constants (frozen parameters)."""
    if not m.all_constant("w", "b"):
        return m.fail("linear weight is not a constant")
    if m.value("w") is None or m.value("w").dim() != 2:
        return m.fail("linear weight is not a 2-d tensor")
    return m.ok()


def linear_target(activation: Callable[..., torch.Tensor] | None) -> Callable[..., Any]:
    """The target ``activation(linear(x, w, b))`` (or the bare ``linear(x, w, b)``)."""

    def target(x, w, b):
        linear = F.linear(x, w, b)
        if activation is None:
            return linear, {"linear": linear}
        out = activation(linear)
        return out, {"linear": linear, "act": out}

    return target


class LinearActivation(ActivationFusion):
    """Linear [-> activation] becomes one FusedLinear(activation=...).

    Args:
        name: the pattern name.
        activation: the canonical activation function, or None for a lone linear layer.
    """

    id_node = "linear"
    qdq = LINEAR_QDQ
    make_target = staticmethod(linear_target)
    check_op = staticmethod(check_linear)

    def fused_module(self, m: Match, activation: str | None) -> FusedLinear:
        return FusedLinear(m.value("w"), m.value("b"), activation=activation, kind=self.name)


LINEAR_RELU = LinearActivation("linear_relu", torch.relu)
LINEAR_GELU = LinearActivation("linear_gelu", F.gelu)  # transformer MLP; exact or tanh
LINEAR_SILU = LinearActivation("linear_silu", F.silu)
LINEAR_HARDSWISH = LinearActivation("linear_hardswish", F.hardswish)  # MobileNetV3 classifier
LINEAR = LinearActivation("linear", None)

LINEAR_PATTERNS = (LINEAR_RELU, LINEAR_GELU, LINEAR_SILU, LINEAR_HARDSWISH, LINEAR)
