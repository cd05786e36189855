"""The ``tensorrt`` target: the shared conversions, fusions and SmoothQuant, and its INT8 placement.

Its quantizer (``BACKEND.quantizer``) follows TensorRT's explicit-quantization rules: Q/DQ on
the inputs of Conv/Gemm/MatMul and on the skip input of a residual Add (the conv branch stays
inside the fused conv-add, so TensorRT fuses the Add into the conv), SmoothQuant before
LayerNorm -> Linear (:mod:`embedl_dynamo.backends.placement_rules`). The conversion and fusion
lists are :mod:`embedl_dynamo.patterns.common`'s, the SmoothQuant list
:mod:`embedl_dynamo.backends.common`'s; ``TENSORRT_QUANTIZED_PATTERNS`` is this target's own.
"""

from __future__ import annotations

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.attention_placement import (
    QuantAttention,
    QuantFusedAttention,
    QuantSDPA,
    SplitAttentionForTensorRT,
)
from embedl_dynamo.backends.common import COMMON_SMOOTH_PATTERNS
from embedl_dynamo.backends.placement_rules import (
    QuantConv,
    QuantFusedModule,
    QuantLinear,
    QuantMatMul,
    QuantResidualAdd,
)
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS, COMMON_FUSION_PATTERNS
from embedl_dynamo.quant.int8.spec import TENSORRT_INT8

__all__ = ["BACKEND", "TENSORRT_PATTERNS", "TENSORRT_QUANTIZED_PATTERNS"]

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
# every phase's list, in pipeline order (for get_transformation_plan and transform)
TENSORRT_PATTERNS = (
    *COMMON_CONVERSION_PATTERNS,
    *COMMON_FUSION_PATTERNS,
    *COMMON_SMOOTH_PATTERNS,
    *TENSORRT_QUANTIZED_PATTERNS,
)

BACKEND = Backend(
    name="tensorrt",
    conversion_patterns=COMMON_CONVERSION_PATTERNS,
    fusion_patterns=COMMON_FUSION_PATTERNS,
    smooth_patterns=COMMON_SMOOTH_PATTERNS,
    quantized_patterns=TENSORRT_QUANTIZED_PATTERNS,
    quantization=TENSORRT_INT8,
    runtimes=("tensorrt", "torch_tensorrt", "openvino", "onnxruntime"),
    description="NVIDIA TensorRT: explicit-quantization INT8, fused conv/linear/attention kernels",
)
