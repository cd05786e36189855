"""Fusions of a convolution with its eval-mode BatchNorm and activation.

``act(bn(conv(x, w, b)))  ->  act(conv(x, w', b'))`` with
``w' = w * gamma / sqrt(var + eps)`` and ``b' = (b - mean) * gamma / sqrt(var + eps) + beta``.
TensorRT and ONNX Runtime run conv + bias + activation as one kernel; folding the BatchNorm
removes a full pass over the activation tensor.

One pattern class per activation (``conv_bn_relu``, ``conv_bn_relu6``, ``conv_bn_silu``,
``conv_bn_hardswish``, ``conv_bn_gelu``) so that plan ids name the kernel and a user can toggle
one kind with a glob (``plan.disable("conv_bn_gelu@*")``). Only 2-d convolutions are matched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.fused_modules import FusedConv, activation_name, fold_batch_norm
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = [
    "CONV_BN_PATTERNS",
    "ConvBN",
    "ConvBNGELU",
    "ConvBNHardswish",
    "ConvBNReLU",
    "ConvBNReLU6",
    "ConvBNSiLU",
    "check_activation",
    "check_conv",
    "check_conv_bn",
    "fused_conv_from_match",
]

CONV_QDQ = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})


def check_conv(m: Match) -> MatchResult:
    """The convolution's weight and bias must be constants (frozen parameters)."""
    if not m.all_constant("w", "b"):
        return m.fail("convolution weight is not a constant")
    return m.ok()


def check_conv_bn(m: Match) -> MatchResult:
    """The conditions under which BatchNorm can be folded into the convolution."""
    if m.kwarg("bn", "training"):
        return m.fail("BatchNorm is in training mode (call model.eval())")
    if not m.all_constant("w", "b"):
        return m.fail("convolution weight is not a constant")
    if not m.all_constant("mean", "var", "gamma", "beta"):
        return m.fail("BatchNorm statistics are not constants")
    weight = m.value("w")
    if m.value("mean") is None or m.value("mean").shape[0] != weight.shape[0]:
        return m.fail("BatchNorm channels do not match the convolution's output channels")
    return m.ok()


def check_activation(m: Match, name: str = "act") -> MatchResult:
    """The activation node ``name`` must be one a fused module can run."""
    if activation_name(m[name]) is None:
        approximate = m[name].kwargs.get("approximate")
        return m.fail(f"activation {m[name].target.__name__}(approximate={approximate!r}) is "
                      "not supported by the fused kernel")  # fmt: skip
    return m.ok()


def fused_conv_from_match(
    m: Match, activation: str | None, kind: str, cls: type[FusedConv] = FusedConv, **extra
) -> FusedConv:
    """Build the FusedConv (or ``cls``) for a conv[-bn][-act] match (``bn`` optional)."""
    conv = m["conv"]
    weight, bias = m.value("w"), m.value("b")
    if "bn" in m and m["bn"] is not None:
        weight, bias = fold_batch_norm(
            weight, bias, m.value("mean"), m.value("var"), m.value("gamma"), m.value("beta"),
            m.kwarg("bn", "eps"),
        )  # fmt: skip
    return cls(
        weight,
        bias,
        conv.kwargs["stride"],
        conv.kwargs["padding"],
        conv.kwargs["dilation"],
        conv.kwargs["groups"],
        activation=activation,
        kind=kind,
        **extra,
    )


def _conv_bn_act_target(act: Callable[..., torch.Tensor]):
    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        out = act(bn)
        return out, {"conv": conv, "bn": bn, "act": out, "out": out}

    return staticmethod(target)


class _ConvBNAct(Pattern):
    """Conv -> BatchNorm -> activation becomes one FusedConv(activation=...)."""

    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    def check(self, m: Match) -> MatchResult:
        result = check_conv_bn(m)
        return result if not result else check_activation(m)

    def replace(self, m: Match):
        act = activation_name(m["act"])
        return m.call_module(fused_conv_from_match(m, act, self.name), m["x"])


class ConvBNReLU(_ConvBNAct):
    """Conv -> BatchNorm -> ReLU (ResNet)."""

    name = "conv_bn_relu"
    target = _conv_bn_act_target(torch.relu)


class ConvBNReLU6(_ConvBNAct):
    """Conv -> BatchNorm -> ReLU6 (MobileNetV2)."""

    name = "conv_bn_relu6"
    target = _conv_bn_act_target(F.relu6)


class ConvBNSiLU(_ConvBNAct):
    """Conv -> BatchNorm -> SiLU (EfficientNet, YOLO)."""

    name = "conv_bn_silu"
    target = _conv_bn_act_target(F.silu)


class ConvBNHardswish(_ConvBNAct):
    """Conv -> BatchNorm -> Hardswish (MobileNetV3)."""

    name = "conv_bn_hardswish"
    target = _conv_bn_act_target(F.hardswish)


class ConvBNGELU(_ConvBNAct):
    """Conv -> BatchNorm -> GELU (ConvNeXt-style stems); exact or tanh approximation."""

    name = "conv_bn_gelu"
    target = _conv_bn_act_target(F.gelu)


class ConvBN(Pattern):
    """Conv -> BatchNorm becomes one FusedConv with the BatchNorm folded into its weights."""

    name = "conv_bn"
    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    @staticmethod
    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        return bn, {"conv": conv, "bn": bn}

    def check(self, m: Match) -> MatchResult:
        return check_conv_bn(m)

    def replace(self, m: Match):
        return m.call_module(fused_conv_from_match(m, None, self.name), m["x"])


CONV_BN_PATTERNS = (
    ConvBNReLU(),
    ConvBNReLU6(),
    ConvBNSiLU(),
    ConvBNHardswish(),
    ConvBNGELU(),
    ConvBN(),
)
