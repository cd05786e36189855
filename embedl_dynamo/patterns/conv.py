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

from embedl_dynamo.patterns.activation_fusion import ActivationFusion
from embedl_dynamo.patterns.conv_bn import CONV_QDQ, check_conv, fused_conv_from_match
from embedl_dynamo.patterns.fused_modules import FusedConv
from embedl_dynamo.rewrite.match import Match

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


class ConvActivation(ActivationFusion):
    """Conv [-> activation] becomes one FusedConv(activation=...).

    Args:
        name: the pattern name.
        activation: the canonical activation function, or None for a lone convolution.
    """

    id_node = "conv"
    qdq = CONV_QDQ
    make_target = staticmethod(conv_target)
    check_op = staticmethod(check_conv)

    def fused_module(self, m: Match, activation: str | None) -> FusedConv:
        return fused_conv_from_match(m, activation, self.name)


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
