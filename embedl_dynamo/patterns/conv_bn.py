"""Fusions of a convolution with its eval-mode BatchNorm and activation.

``act(bn(conv(x, w, b)))  ->  act(conv(x, w', b'))`` with
``w' = w * gamma / sqrt(var + eps)`` and ``b' = (b - mean) * gamma / sqrt(var + eps) + beta``.
TensorRT and ONNX Runtime run conv + bias + activation as one kernel; folding the BatchNorm
removes a full pass over the activation tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..pattern import QDQ, Match, MatchResult, Pattern, Role
from .fused_modules import ACTIVATIONS, FusedConv, fold_batch_norm

__all__ = ["ConvBN", "ConvBNReLU", "check_conv_bn", "fused_conv_from_match"]


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


def fused_conv_from_match(m: Match, activation: str | None, kind: str) -> FusedConv:
    """Build the FusedConv for a conv[-bn][-act] match (``bn`` optional)."""
    conv = m["conv"]
    weight, bias = m.value("w"), m.value("b")
    if "bn" in m and m["bn"] is not None:
        weight, bias = fold_batch_norm(
            weight, bias, m.value("mean"), m.value("var"), m.value("gamma"), m.value("beta"),
            m.kwarg("bn", "eps"),
        )  # fmt: skip
    return FusedConv(
        weight,
        bias,
        conv.kwargs["stride"],
        conv.kwargs["padding"],
        conv.kwargs["dilation"],
        conv.kwargs["groups"],
        activation=activation,
        kind=kind,
    )


class ConvBNReLU(Pattern):
    """Conv -> BatchNorm -> ReLU becomes one FusedConv(activation="relu")."""

    name = "conv_bn_relu"
    phase = "fusion"
    id_node = "conv"
    qdq = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})

    @staticmethod
    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        out = torch.relu(bn)
        return out, {"conv": conv, "bn": bn, "out": out}

    def check(self, m: Match) -> MatchResult:
        return check_conv_bn(m)

    def replace(self, m: Match):
        act = ACTIVATIONS[m["out"].target]
        return m.call_module(fused_conv_from_match(m, act, self.name), m["x"])


class ConvBN(Pattern):
    """Conv -> BatchNorm becomes one FusedConv with the BatchNorm folded into its weights."""

    name = "conv_bn"
    phase = "fusion"
    id_node = "conv"
    qdq = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})

    @staticmethod
    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        return bn, {"conv": conv, "bn": bn}

    def check(self, m: Match) -> MatchResult:
        return check_conv_bn(m)

    def replace(self, m: Match):
        return m.call_module(fused_conv_from_match(m, None, self.name), m["x"])
