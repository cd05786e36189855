"""Quantization, one folder per precision family (as torchao's ``quantize_/workflows``):

* :mod:`~embedl_dynamo.quant.int8`: INT8's calibrated Q/DQ: specs, the per-target quantizer,
  observers, calibration (cached on disk), QDQ insertion, QAT and lazy calibration on a compiled
  model's first calls; ``fp8`` and ``mixed`` calibrate through it;
* :mod:`~embedl_dynamo.quant.fp8`: TensorRT's FP8, from INT8's placement and calibration;
* :mod:`~embedl_dynamo.quant.weight_only`: weight-only int8 / int4;
* :mod:`~embedl_dynamo.quant.half`: FP16 / BF16 in the graph.

Entry points on a fused graph: :func:`quantize_graph` with a Backend's :class:`Quantizer`.
On a module, :func:`embedl_dynamo.quantize` and :func:`embedl_dynamo.prepare_qat`.
"""

from embedl_dynamo.quant.int8.qat import make_trainable
from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.quant.int8.smooth import SmoothingRule
from embedl_dynamo.quant.int8.spec import (
    ONNXRUNTIME_INT8,
    TENSORRT_INT8,
    QuantizationConfig,
    QuantizationSpec,
)
from embedl_dynamo.quant.int8.stage import quantize_graph

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
