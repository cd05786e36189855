"""The ``onnxruntime`` target: ONNX Runtime's CPU execution provider.

Conversions and fusions are the shared ones (:mod:`embedl_dynamo.patterns.common`: plain
Conv/Gemm nodes, which ORT fuses too), and grouped-query attention over the K/V heads themselves
(:class:`~embedl_dynamo.patterns.grouped_query.GroupedQueryAttention`: broadcast MatMuls, where
the shared SDPA fusion reads K/V repeated by a ``Tile`` per query head); the INT8 placement
differs (uint8 activations, QDQ around conv outputs) and comes with quantization.
"""

from __future__ import annotations

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.ort_preparation import SplitFusedForORT
from embedl_dynamo.backends.placement_rules import QuantConv, QuantLinear, QuantResidualAdd
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS, COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.grouped_query import GroupedQueryAttention
from embedl_dynamo.quant.int8.spec import ONNXRUNTIME_INT8
from embedl_dynamo.rewrite.qdq import Role

__all__ = ["BACKEND", "ONNXRUNTIME_QUANTIZED_PATTERNS"]

ONNXRUNTIME_QUANTIZED_PATTERNS = (
    SplitFusedForORT(),
    QuantConv("quant_conv_ort", output=Role.ACTIVATION),
    QuantLinear("quant_linear_ort", output=Role.ACTIVATION),
    QuantResidualAdd("quant_add_ort", output=Role.ACTIVATION, float_stream=True),
)

BACKEND = Backend(
    name="onnxruntime",
    conversion_patterns=COMMON_CONVERSION_PATTERNS,
    fusion_patterns=(GroupedQueryAttention(), *COMMON_FUSION_PATTERNS),
    quantized_patterns=ONNXRUNTIME_QUANTIZED_PATTERNS,
    quantization=ONNXRUNTIME_INT8,
    runtimes=("onnxruntime",),
    description="ONNX Runtime CPU: QLinearConv/QLinearAdd INT8 placement (uint8 activations)",
)
