"""Fusions of a convolution without BatchNorm: ``act(conv(x, w, b))`` and the bare ``conv``.

Squeeze-and-excitation blocks (``relu(conv1x1(pool(x)))``, ``hardsigmoid(conv1x1(s))``) and
patch embeddings have no BatchNorm; TensorRT still runs conv + bias + activation as one kernel.
The bare ``conv`` pattern (one node) gives every remaining convolution a FusedConv, so its input
and weight get TensorRT's QDQ. Only 2-d convolutions are matched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.conv_bn import (
    CONV_QDQ,
    check_activation,
    check_conv,
    fused_conv_from_match,
)
from embedl_dynamo.patterns.fused_modules import activation_name
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = [
    "CONV",
    "CONV_GELU",
    "CONV_HARDSIGMOID",
    "CONV_HARDSWISH",
    "CONV_PATTERNS",
    "CONV_RELU",
    "CONV_RELU6",
    "CONV_SILU",
    "ConvActivation",
    "conv_target",
]


def conv_target(activation: Callable[..., torch.Tensor] | None) -> Callable[..., Any]:
    """The target ``activation(conv(x, w, b))`` (or the bare ``conv(x, w, b)``)."""

    def target(x, w, b):
        conv = F.conv2d(x, w, b)
        if activation is None:
            return conv, {"conv": conv}
        out = activation(conv)
        return out, {"conv": conv, "act": out}

    return target


class ConvActivation(Pattern):
    """Conv [-> activation] becomes one FusedConv(activation=...).

    Args:
        name: the pattern name.
        activation: the canonical activation function, or None for a lone convolution.
    """

    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    def __init__(self, name: str, activation: Callable[..., torch.Tensor] | None) -> None:
        self.name = name
        self.activation = activation
        self.target = conv_target(activation)

    def check(self, m: Match) -> MatchResult:
        result = check_conv(m)
        if not result or self.activation is None:
            return result
        return check_activation(m)

    def replace(self, m: Match):
        act = activation_name(m["act"]) if self.activation is not None else None
        return m.call_module(fused_conv_from_match(m, act, self.name), m["x"])


CONV_RELU = ConvActivation("conv_relu", torch.relu)  # squeeze-and-excitation reduce conv
CONV_RELU6 = ConvActivation("conv_relu6", F.relu6)
CONV_SILU = ConvActivation("conv_silu", F.silu)
CONV_HARDSWISH = ConvActivation("conv_hardswish", F.hardswish)
CONV_HARDSIGMOID = ConvActivation("conv_hardsigmoid", F.hardsigmoid)  # MobileNetV3 SE expand
CONV_GELU = ConvActivation("conv_gelu", F.gelu)
CONV = ConvActivation("conv", None)

CONV_PATTERNS = (
    CONV_RELU,
    CONV_RELU6,
    CONV_SILU,
    CONV_HARDSWISH,
    CONV_HARDSIGMOID,
    CONV_GELU,
    CONV,
)
