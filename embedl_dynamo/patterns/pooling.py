"""Pooling fusions: the network stem ``maxpool(relu(bn(conv(x))))`` and adaptive average pooling.

The stem folds the BatchNorm into the convolution (``w' = w * g / std``,
``b' = (b - mean) * g / std + beta``) and keeps conv, ReLU and max pool in one module, so no QDQ
lands between them (TensorRT quantizes the conv input and weight; max pooling commutes with a
per-tensor quantizer, so it runs in INT8 inside the group). ``adaptive_avg_pool`` wraps the
global pool so its input is quantized like TensorRT's INT8 pooling layer expects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedl_dynamo.patterns.conv_bn import CONV_QDQ, check_conv_bn, fused_conv_from_match
from embedl_dynamo.patterns.fused_modules import FusedAdaptiveAvgPool, FusedConvMaxPool
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = ["POOLING_PATTERNS", "AdaptiveAvgPool", "StemConvBNReLUMaxPool"]

_POOL_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")


class StemConvBNReLUMaxPool(Pattern):
    """Conv -> BatchNorm -> ReLU -> MaxPool2d becomes one FusedConvMaxPool (ResNet stem)."""

    name = "stem_conv_bn_relu_maxpool"
    phase = "fusion"
    id_node = "conv"
    qdq = CONV_QDQ

    @staticmethod
    def target(x, w, b, mean, var, gamma, beta):
        conv = F.conv2d(x, w, b)
        bn = F.batch_norm(conv, mean, var, gamma, beta)
        act = torch.relu(bn)
        out = F.max_pool2d(act, 3)
        return out, {"conv": conv, "bn": bn, "act": act, "pool": out}

    def check(self, m: Match) -> MatchResult:
        if m.kwarg("pool", "return_indices"):
            return m.fail("max pool returns indices")
        return check_conv_bn(m)

    def replace(self, m: Match):
        pool = {k: m.kwarg("pool", k) for k in _POOL_ARGS}
        fused = fused_conv_from_match(m, "relu", self.name, cls=FusedConvMaxPool, pool=pool)
        return m.call_module(fused, m["x"])


class AdaptiveAvgPool(Pattern):
    """``adaptive_avg_pool2d(x, size)`` becomes a FusedAdaptiveAvgPool with a quantized input."""

    name = "adaptive_avg_pool"
    phase = "fusion"
    qdq = QDQ(inputs={"x": Role.ACTIVATION})

    @staticmethod
    def target(x):
        pool = F.adaptive_avg_pool2d(x, 1)
        return pool, {"pool": pool}

    def replace(self, m: Match):
        return m.call_module(FusedAdaptiveAvgPool(m.kwarg("pool", "output_size")), m["x"])


POOLING_PATTERNS = (StemConvBNReLUMaxPool(), AdaptiveAvgPool())
