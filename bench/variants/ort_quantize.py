"""ONNX Runtime's own static INT8 quantization of a model (``ort_int8``): the specialist our
INT8 path is measured against (the CPU table, the digits accuracy test).

The model is exported to ONNX in float and handed to
``onnxruntime.quantization.quantize_static`` in its best CPU configuration here: QDQ format,
uint8 activations, int8 per-channel weights (FACTS.md: 53 int8 convs on ResNet-50).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from bench.harness.measure import first_tensor
from bench.variants import Built, Case
from embedl_dynamo.runtimes.onnxruntime.session import create_session

__all__ = ["FirstOutput", "build", "ort_quantize_static"]


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
            model,
            (calibration[0],),
            str(float_path),
            input_names=["x"],
            dynamic_axes={"x": {0: "n"}},
            dynamo=False,
        )

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items = iter([{"x": b.numpy()} for b in calibration])

        def get_next(self):
            return next(self._items, None)

    quantize_static(
        str(float_path),
        str(int8_path),
        _Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return create_session(int8_path, ["CPUExecutionProvider"])


class FirstOutput(nn.Module):
    """``model`` returning its first output tensor only: TorchScript's ONNX exporter, which
    ``quantize_static``'s export uses, fails on Hugging Face models' keyword arguments and
    output classes (``BertModel.forward() got multiple values for argument 'use_cache'``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_tensor(self.model(x))


def build(case: Case, name: str) -> Built:
    """``ort_int8`` for ``case`` (a model of one input), calibrated on its batches."""
    import onnxruntime

    if len(case.inputs) != 1:
        raise ValueError(
            f"the quantize_static peer takes one input; this model takes {len(case.inputs)}"
        )
    workdir = tempfile.mkdtemp(prefix="ort_", dir=case.workdir)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_static warns layer by layer on the root logger
    try:
        batches = [batch[0] for batch in case.calibration]
        session = ort_quantize_static(FirstOutput(case.model).eval(), batches, workdir)
    finally:
        root.setLevel(level)
    feed = {"x": case.inputs[0].numpy()}
    tool = f"ONNX Runtime {onnxruntime.__version__} quantize_static"
    return Built(lambda: torch.from_numpy(session.run(None, feed)[0]), tool=tool)
