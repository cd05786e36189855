"""The SmoothQuant rule list the built-in targets share (``tensorrt``, ``openvino``).

The shared conversion and fusion lists are in :mod:`embedl_dynamo.patterns.common`. A smoothing
rule belongs to the quantization stage (:mod:`embedl_dynamo.quant.int8.smooth`), a layer above the
pattern library, so the shared list of them is kept here, beside the targets that use it.
"""

from __future__ import annotations

from embedl_dynamo.quant.int8.smooth import SmoothLayerNormLinear

__all__ = ["COMMON_SMOOTH_PATTERNS"]

# SmoothQuant before LayerNorm -> Linear, at the paper's migration strength
COMMON_SMOOTH_PATTERNS = (SmoothLayerNormLinear(alpha=0.5),)
