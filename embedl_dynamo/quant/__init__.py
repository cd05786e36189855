"""INT8 quantization: QDQ specs, observers, calibration (cached on disk), QDQ insertion, QAT.

Public entry points: :func:`quantize` (fuse + calibrate + fake-quant a module),
:func:`prepare_qat` (the same, trainable), :func:`quantize_for_pipeline` (the pipeline's
hook) and :func:`~.lazy.calibrate_then_build` (calibration on a compiled model's first calls).
"""

from embedl_dynamo.quant.api import quantize, quantize_for_pipeline, quantize_graph
from embedl_dynamo.quant.observers import NonFiniteError
from embedl_dynamo.quant.qat import prepare_qat
from embedl_dynamo.quant.spec import (
    ONNXRUNTIME_INT8,
    TENSORRT_INT8,
    QuantizationConfig,
    QuantizationSpec,
)

__all__ = [
    "ONNXRUNTIME_INT8",
    "TENSORRT_INT8",
    "NonFiniteError",
    "QuantizationConfig",
    "QuantizationSpec",
    "prepare_qat",
    "quantize",
    "quantize_for_pipeline",
    "quantize_graph",
]
