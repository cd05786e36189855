"""Fusions of a fully connected layer: ``act(linear(x, w, b))`` and the bare ``linear``.

TensorRT runs the matrix multiply, bias and activation as one kernel (and ONNX Runtime as
``Gemm`` + activation); the fused module declares TensorRT's QDQ: the input and the weight per
output feature. One pattern per activation keeps plan ids readable (``linear_gelu@mlp.0``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.conv_bn import check_activation
from embedl_dynamo.patterns.fused_modules import FusedLinear, activation_name
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = [
    "LINEAR_PATTERNS",
    "Linear",
    "LinearGELU",
    "LinearHardswish",
    "LinearReLU",
    "LinearSiLU",
    "check_linear",
]

LINEAR_QDQ = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})


def check_linear(m: Match) -> MatchResult:
    """The weight and bias must be constants (frozen parameters)."""
    if not m.all_constant("w", "b"):
        return m.fail("linear weight is not a constant")
    if m.value("w") is None or m.value("w").dim() != 2:
        return m.fail("linear weight is not a 2-d tensor")
    return m.ok()


def _linear_act_target(act: Callable[..., torch.Tensor]):
    def target(x, w, b):
        linear = F.linear(x, w, b)
        out = act(linear)
        return out, {"linear": linear, "act": out}

    return staticmethod(target)


class _LinearAct(Pattern):
    """Linear -> activation becomes one FusedLinear(activation=...)."""

    phase = "fusion"
    id_node = "linear"
    qdq = LINEAR_QDQ

    def check(self, m: Match) -> MatchResult:
        result = check_linear(m)
        return result if not result else check_activation(m)

    def replace(self, m: Match):
        act = activation_name(m["act"])
        fused = FusedLinear(m.value("w"), m.value("b"), activation=act, kind=self.name)
        return m.call_module(fused, m["x"])


class LinearReLU(_LinearAct):
    name = "linear_relu"
    target = _linear_act_target(torch.relu)


class LinearGELU(_LinearAct):
    """Linear -> GELU (transformer MLP); exact or tanh approximation."""

    name = "linear_gelu"
    target = _linear_act_target(F.gelu)


class LinearSiLU(_LinearAct):
    name = "linear_silu"
    target = _linear_act_target(F.silu)


class LinearHardswish(_LinearAct):
    """Linear -> Hardswish (MobileNetV3 classifier)."""

    name = "linear_hardswish"
    target = _linear_act_target(F.hardswish)


class Linear(Pattern):
    """A lone linear layer becomes a FusedLinear (no activation)."""

    name = "linear"
    phase = "fusion"
    id_node = "linear"
    qdq = LINEAR_QDQ

    @staticmethod
    def target(x, w, b):
        linear = F.linear(x, w, b)
        return linear, {"linear": linear}

    def check(self, m: Match) -> MatchResult:
        return check_linear(m)

    def replace(self, m: Match):
        fused = FusedLinear(m.value("w"), m.value("b"), kind=self.name)
        return m.call_module(fused, m["x"])


LINEAR_PATTERNS = (LinearReLU(), LinearGELU(), LinearSiLU(), LinearHardswish(), Linear())
