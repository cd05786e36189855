"""The ``tensorrt`` target: the full pattern set (conversions, fusions, smooth, quantized).

Pattern lists are ordered longest first; the engine sorts fusions by size anyway, so the order
here only breaks ties.
"""

from __future__ import annotations

from ..backend import Backend
from ..patterns.conv_bn import ConvBN, ConvBNReLU

__all__ = [
    "BACKEND",
    "TENSORRT_CONVERSION_PATTERNS",
    "TENSORRT_FUSION_PATTERNS",
    "TENSORRT_PATTERNS",
    "TENSORRT_QUANTIZED_PATTERNS",
    "TENSORRT_SMOOTH_PATTERNS",
]

TENSORRT_CONVERSION_PATTERNS = ()
TENSORRT_FUSION_PATTERNS = (ConvBNReLU(), ConvBN())
TENSORRT_SMOOTH_PATTERNS = ()
TENSORRT_QUANTIZED_PATTERNS = ()
TENSORRT_PATTERNS = (
    *TENSORRT_CONVERSION_PATTERNS,
    *TENSORRT_FUSION_PATTERNS,
    *TENSORRT_SMOOTH_PATTERNS,
    *TENSORRT_QUANTIZED_PATTERNS,
)

BACKEND = Backend(
    name="tensorrt",
    conversion_patterns=TENSORRT_CONVERSION_PATTERNS,
    fusion_patterns=TENSORRT_FUSION_PATTERNS,
    smooth_patterns=TENSORRT_SMOOTH_PATTERNS,
    quantized_patterns=TENSORRT_QUANTIZED_PATTERNS,
    description="NVIDIA TensorRT: explicit-quantization INT8, fused conv/linear/attention kernels",
)
