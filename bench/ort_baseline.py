"""ONNX Runtime's own static INT8 quantization of a model: the specialist our INT8 path is
measured against (``bench/bench_int8.py``, the digits accuracy test).

The model is exported to ONNX in float and handed to
``onnxruntime.quantization.quantize_static`` in its best CPU configuration here: QDQ format,
uint8 activations, int8 per-channel weights (FACTS.md: 53 int8 convs on ResNet-50).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from embedl_dynamo.runtimes.onnxruntime.session import create_session

__all__ = ["ort_quantize_static"]


def ort_quantize_static(model: nn.Module, calibration: Sequence[torch.Tensor], workdir: str | Path):
    """Quantize ``model`` with ONNX Runtime's ``quantize_static`` and open it on the CPU.

    Args:
        model: a float model taking one tensor input (not modified).
        calibration: input batches for ORT's calibrator.
        workdir: where ``float.onnx`` and ``ort_int8.onnx`` are written.

    Returns:
        The ``onnxruntime.InferenceSession`` of the quantized model; its input is named ``x``
        and has a dynamic batch axis.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    workdir = Path(workdir)
    float_path, int8_path = workdir / "float.onnx", workdir / "ort_int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (calibration[0],), str(float_path), input_names=["x"],
            dynamic_axes={"x": {0: "n"}}, dynamo=False,
        )  # fmt: skip

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items = iter([{"x": b.numpy()} for b in calibration])

        def get_next(self):
            return next(self._items, None)

    quantize_static(
        str(float_path), str(int8_path), _Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
    )  # fmt: skip
    return create_session(int8_path, ["CPUExecutionProvider"])
