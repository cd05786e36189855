"""Fusions of a convolution without BatchNorm: ``act(conv(x, w, b))`` and the bare ``conv``.

Squeeze-and-excitation blocks (``relu(conv1x1(pool(x)))``, ``hardsigmoid(conv1x1(s))``) and
patch embeddings have no BatchNorm; TensorRT still runs conv + bias + activation as one kernel.
The bare ``conv`` pattern (one node) gives every remaining convolution a FusedConv, so its input
and weight get TensorRT's QDQ. Only 2-d convolutions are matched.
"""

from __future__ import annotations

from collections.abc import Callable

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
    "CONV_PATTERNS",
    "Conv",
    "ConvGELU",
    "ConvHardsigmoid",
    "ConvHardswish",
    "ConvReLU",
    "ConvReLU6",
    "ConvSiLU",
]


def _conv_act_target(act: Callable[..., torch.Tensor]):
    def target(x, w, b):
        conv = F.conv2d(x, w, b)
        out = act(conv)
        return out, {"conv": conv, "act": out}

    return staticmethod(target)


class _ConvAct(Pattern):
    """Conv -> activation becomes one FusedConv(activation=...)."""

    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    def check(self, m: Match) -> MatchResult:
        result = check_conv(m)
        return result if not result else check_activation(m)

    def replace(self, m: Match):
        act = activation_name(m["act"])
        return m.call_module(fused_conv_from_match(m, act, self.name), m["x"])


class ConvReLU(_ConvAct):
    """Conv -> ReLU (squeeze-and-excitation reduce conv)."""

    name = "conv_relu"
    target = _conv_act_target(torch.relu)


class ConvReLU6(_ConvAct):
    name = "conv_relu6"
    target = _conv_act_target(F.relu6)


class ConvSiLU(_ConvAct):
    name = "conv_silu"
    target = _conv_act_target(F.silu)


class ConvHardswish(_ConvAct):
    name = "conv_hardswish"
    target = _conv_act_target(F.hardswish)


class ConvHardsigmoid(_ConvAct):
    """Conv -> Hardsigmoid (squeeze-and-excitation expand conv, MobileNetV3)."""

    name = "conv_hardsigmoid"
    target = _conv_act_target(F.hardsigmoid)


class ConvGELU(_ConvAct):
    name = "conv_gelu"
    target = _conv_act_target(F.gelu)


class Conv(Pattern):
    """A lone convolution becomes a FusedConv (no activation)."""

    name = "conv"
    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    @staticmethod
    def target(x, w, b):
        conv = F.conv2d(x, w, b)
        return conv, {"conv": conv}

    def check(self, m: Match) -> MatchResult:
        return check_conv(m)

    def replace(self, m: Match):
        return m.call_module(fused_conv_from_match(m, None, self.name), m["x"])


CONV_PATTERNS = (
    ConvReLU(),
    ConvReLU6(),
    ConvSiLU(),
    ConvHardswish(),
    ConvHardsigmoid(),
    ConvGELU(),
    Conv(),
)
