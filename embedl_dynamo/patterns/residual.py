"""Fusions of a convolution with the residual add that follows it (ResNet, MobileNet blocks).

``relu(bn(conv(x)) + r)  ->  relu(conv'(x) + r)`` with the BatchNorm folded into ``conv'``
(``w' = w * g / std``, ``b' = (b - mean) * g / std + beta``). TensorRT runs the add (and the
ReLU) as the convolution's epilogue when both add inputs carry QDQ, so the fused module takes
``(x, residual)`` and declares both as quantized inputs. The add is commutative: ``r + bn`` and
``bn + r`` both match. Only a residual of exactly the convolution's output shape is fused (a
broadcasting add is not an epilogue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.patterns.conv_bn import check_conv_bn, fused_conv_from_match
from embedl_dynamo.patterns.fused_modules import FusedConvAdd
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = [
    "CONV_BN_ADD",
    "CONV_BN_ADD_RELU",
    "RESIDUAL_PATTERNS",
    "RESIDUAL_QDQ",
    "ConvBNAdd",
    "check_residual",
    "conv_bn_add_target",
]

RESIDUAL_QDQ = QDQ(
    inputs={"x": Role.ACTIVATION, "residual": Role.ACTIVATION}, weights={"w": Role.WEIGHT}
)


def check_residual(m: Match) -> MatchResult:
    """The residual must be a tensor computed outside the match, of the conv output's shape."""
    residual = m["residual"]
    if not isinstance(residual, fx.Node):
        return m.fail(f"residual is the constant {residual!r}, not a tensor")
    if residual in m.node_map.values():
        return m.fail("residual is the convolution's own output")
    conv_shape, residual_shape = m.shape("bn"), m.shape("residual")
    if conv_shape is not None and residual_shape is not None and conv_shape != residual_shape:
        return m.fail(
            f"residual shape {residual_shape} differs from the convolution output shape "
            f"{conv_shape} (a broadcasting add is not fused)"
        )
    return m.ok()


def conv_bn_add_target(relu: bool) -> Callable[..., Any]:
    """The target ``[relu](bn(conv(x, w, b)) + residual)``."""

    def target(x, w, b, mean, var, gamma, beta, residual):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        add = bn + residual
        if not relu:
            return add, {"conv": conv, "bn": bn, "add": add}
        out = torch.relu(add)
        return out, {"conv": conv, "bn": bn, "add": add, "out": out}

    return target


class ConvBNAdd(Pattern):
    """Conv -> BatchNorm -> Add(residual) [-> ReLU] becomes one FusedConvAdd(x, residual).

    Args:
        name: the pattern name.
        relu: whether a ReLU follows the add (ResNet) or not (MobileNet's linear bottleneck).
    """

    phase = "fusion"
    id_node = "conv"
    qdq = RESIDUAL_QDQ

    def __init__(self, name: str, relu: bool) -> None:
        self.name = name
        self.relu = relu
        self.target = conv_bn_add_target(relu)

    def check(self, m: Match) -> MatchResult:
        result = check_conv_bn(m)
        return result if not result else check_residual(m)

    def replace(self, m: Match):
        fused = fused_conv_from_match(m, "relu" if self.relu else None, self.name, cls=FusedConvAdd)
        return m.call_module(fused, m["x"], m["residual"])


CONV_BN_ADD_RELU = ConvBNAdd("conv_bn_add_relu", relu=True)  # ResNet
CONV_BN_ADD = ConvBNAdd("conv_bn_add", relu=False)  # MobileNet

RESIDUAL_PATTERNS = (CONV_BN_ADD_RELU, CONV_BN_ADD)
