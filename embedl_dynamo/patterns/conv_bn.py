"""Fusions of a convolution with its eval-mode BatchNorm and activation.

``act(bn(conv(x, w, b)))  ->  act(conv(x, w', b'))`` with
``w' = w * gamma / sqrt(var + eps)`` and ``b' = (b - mean) * gamma / sqrt(var + eps) + beta``.
TensorRT and ONNX Runtime run conv + bias + activation as one kernel; folding the BatchNorm
removes a full pass over the activation tensor.

One parametrised class, one instance per activation (``conv_bn_relu``, ``conv_bn_relu6``,
``conv_bn_silu``, ``conv_bn_hardswish``, ``conv_bn_gelu``, and ``conv_bn`` without one) so that
plan ids name the kernel and a user can toggle one kind with a glob
(``plan.disable("conv_bn_gelu@*")``). Only 2-d convolutions are matched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.activation_fusion import ActivationFusion
from embedl_dynamo.patterns.fused_modules import FusedConv, fold_batch_norm
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = [
    "CONV_BN",
    "CONV_BN_GELU",
    "CONV_BN_HARDSWISH",
    "CONV_BN_PATTERNS",
    "CONV_BN_RELU",
    "CONV_BN_RELU6",
    "CONV_BN_SILU",
    "CONV_QDQ",
    "ConvBNActivation",
    "check_conv",
    "check_conv_bn",
    "conv_bn_target",
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


def fused_conv_from_match(
    m: Match, activation: str | None, kind: str, cls: type[FusedConv] = FusedConv, **extra
) -> FusedConv:
    """Build the FusedConv (or ``cls``) for a conv[-bn][-act] match (``bn`` optional)."""
    conv = m["conv"]
    weight, bias = m.value("w"), m.value("b")
    if "bn" in m and m["bn"] is not None:
        weight, bias = fold_batch_norm(
            weight,
            bias,
            m.value("mean"),
            m.value("var"),
            m.value("gamma"),
            m.value("beta"),
            m.kwarg("bn", "eps"),
        )
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


def conv_bn_target(activation: Callable[..., torch.Tensor] | None) -> Callable[..., Any]:
    """The target ``activation(bn(conv(x, w, b)))`` (or ``bn(conv(...))`` without activation)."""

    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        if activation is None:
            return bn, {"conv": conv, "bn": bn}
        out = activation(bn)
        return out, {"conv": conv, "bn": bn, "act": out, "out": out}

    return target


class ConvBNActivation(ActivationFusion):
    """Conv -> BatchNorm [-> activation] becomes one FusedConv (BatchNorm folded, activation fused).

    One class, one instance per activation (``conv_bn_relu``, ``conv_bn_silu``, ... and
    ``conv_bn`` without one), so plan ids name the kernel and a glob toggles one kind.

    Args:
        name: the pattern name (plan ids ``<name>@<module path>``).
        activation: the canonical activation function, or None for conv + BatchNorm only.
    """

    id_node = "conv"
    qdq = CONV_QDQ
    make_target = staticmethod(conv_bn_target)
    check_op = staticmethod(check_conv_bn)

    def fused_module(self, m: Match, activation: str | None) -> FusedConv:
        return fused_conv_from_match(m, activation, self.name)


CONV_BN_RELU = ConvBNActivation("conv_bn_relu", torch.relu)  # ResNet
CONV_BN_RELU6 = ConvBNActivation("conv_bn_relu6", F.relu6)  # MobileNetV2
CONV_BN_SILU = ConvBNActivation("conv_bn_silu", F.silu)  # EfficientNet, YOLO
CONV_BN_HARDSWISH = ConvBNActivation("conv_bn_hardswish", F.hardswish)  # MobileNetV3
CONV_BN_GELU = ConvBNActivation("conv_bn_gelu", F.gelu)  # ConvNeXt-style stems; exact or tanh
CONV_BN = ConvBNActivation("conv_bn", None)

CONV_BN_PATTERNS = (
    CONV_BN_RELU,
    CONV_BN_RELU6,
    CONV_BN_SILU,
    CONV_BN_HARDSWISH,
    CONV_BN_GELU,
    CONV_BN,
)
