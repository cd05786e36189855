"""INT8 quantization: QDQ specs, the per-target quantizer, observers, calibration (cached on
disk), QDQ insertion, QAT and lazy calibration on a compiled model's first calls.

Entry points on a fused graph: :func:`quantize_graph` with a Backend's :class:`Quantizer`.
On a module, :func:`embedl_dynamo.quantize` and :func:`embedl_dynamo.prepare_qat`.
"""

from embedl_dynamo.quant.qat import make_trainable
from embedl_dynamo.quant.quantizer import Quantizer
from embedl_dynamo.quant.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.quant.smooth import SmoothingRule
from embedl_dynamo.quant.spec import (
    ONNXRUNTIME_INT8,
    TENSORRT_INT8,
    QuantizationConfig,
    QuantizationSpec,
)
from embedl_dynamo.quant.stage import quantize_graph

__all__ = [
    "ONNXRUNTIME_INT8",
    "TENSORRT_INT8",
    "PlacementRule",
    "PreparationRewrite",
    "QuantizationConfig",
    "QuantizationSpec",
    "Quantizer",
    "SmoothingRule",
    "make_trainable",
    "quantize_graph",
]
