"""The ``tensorrt`` target: the full pattern set (conversions, fusions, smooth, quantized).

Its quantizer (``BACKEND.quantizer``) follows TensorRT's explicit-quantization rules: Q/DQ on
the inputs of Conv/Gemm/MatMul and on the skip input of a residual Add (the conv branch stays
inside the fused conv-add, so TensorRT fuses the Add into the conv), SmoothQuant before
LayerNorm -> Linear (:mod:`embedl_dynamo.backends.placement_rules`).

Pattern lists are ordered longest first; the engine sorts fusions by size anyway, so the order
here only breaks ties.
"""

from __future__ import annotations

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.attention_placement import (
    QuantAttention,
    QuantFusedAttention,
    QuantSDPA,
    SplitAttentionForTensorRT,
)
from embedl_dynamo.backends.placement_rules import (
    QuantConv,
    QuantFusedModule,
    QuantLinear,
    QuantMatMul,
    QuantResidualAdd,
)
from embedl_dynamo.patterns.adaptive_pool import ADAPTIVE_POOL_PATTERNS
from embedl_dynamo.patterns.attention import ATTENTION_FUSION_PATTERNS
from embedl_dynamo.patterns.attention_decompose import ATTENTION_CONVERSION_PATTERNS
from embedl_dynamo.patterns.conv import CONV_PATTERNS
from embedl_dynamo.patterns.conv_bn import CONV_BN_PATTERNS
from embedl_dynamo.patterns.conversions import CONVERSION_PATTERNS
from embedl_dynamo.patterns.linear import LINEAR_PATTERNS
from embedl_dynamo.patterns.pooling import AdaptiveAvgPool, StemConvBNReLUMaxPool
from embedl_dynamo.patterns.residual import RESIDUAL_PATTERNS
from embedl_dynamo.quant.smooth import SmoothLayerNormLinear
from embedl_dynamo.quant.spec import TENSORRT_INT8

__all__ = [
    "BACKEND",
    "TENSORRT_CONVERSION_PATTERNS",
    "TENSORRT_FUSION_PATTERNS",
    "TENSORRT_PATTERNS",
    "TENSORRT_QUANTIZED_PATTERNS",
    "TENSORRT_SMOOTH_PATTERNS",
]

TENSORRT_CONVERSION_PATTERNS = (
    *ATTENTION_CONVERSION_PATTERNS,
    *CONVERSION_PATTERNS,
    *ADAPTIVE_POOL_PATTERNS,
)
# conv / linear / pooling fusions, longest first (stem and residual: 4 nodes, conv-bn-act: 3...)
_CONV_LINEAR_FUSIONS = (
    StemConvBNReLUMaxPool(),
    *RESIDUAL_PATTERNS,
    *CONV_BN_PATTERNS,
    *CONV_PATTERNS,
    *LINEAR_PATTERNS,
    AdaptiveAvgPool(),
)
TENSORRT_FUSION_PATTERNS = (*_CONV_LINEAR_FUSIONS, *ATTENTION_FUSION_PATTERNS)
TENSORRT_SMOOTH_PATTERNS = (SmoothLayerNormLinear(alpha=0.5),)
TENSORRT_QUANTIZED_PATTERNS = (
    SplitAttentionForTensorRT(),
    QuantAttention(),
    QuantSDPA(),
    QuantConv("quant_conv"),
    QuantLinear("quant_linear"),
    QuantMatMul(),
    QuantResidualAdd("quant_residual_add", branch_only=True),
    QuantFusedAttention(),
    QuantFusedModule(),
)
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
    quantization=TENSORRT_INT8,
    runtimes=("tensorrt", "torch_tensorrt", "openvino", "onnxruntime"),
    description="NVIDIA TensorRT: explicit-quantization INT8, fused conv/linear/attention kernels",
)
