"""The arguments of :func:`~embedl_dynamo.export`, checked before any work: the model, the example
inputs, the path, the opset, the target, the settings and the calibration data.

Each refusal is an :class:`~embedl_dynamo.errors.ExportArgumentError` (a ``ValueError``) naming
the argument and the fix, raised before Dynamo traces anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from embedl_dynamo.backend import Backend, as_backend
from embedl_dynamo.deploy.sidecar import refuse_foreign_sidecar, sidecar_path
from embedl_dynamo.errors import ExportArgumentError, ExportError
from embedl_dynamo.quant.int8.calibrate import calibration_mismatch
from embedl_dynamo.runtimes.registry import runtime_settings
from embedl_dynamo.settings import Settings

__all__ = [
    "MIN_OPSET",
    "check_arguments",
    "check_calibration",
    "export_settings",
    "export_target",
]

MIN_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear


def _as_args(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not args:
        raise ExportArgumentError("example_inputs is empty; pass the model's inputs, e.g. (x,)")
    for i, value in enumerate(args):
        if not isinstance(value, torch.Tensor):
            raise ExportArgumentError(
                f"example_inputs[{i}] is a {type(value).__name__}; export takes tensors only "
                "(wrap other arguments in the model)"
            )
    return args


def export_settings(
    precision: str | None,
    quantize: str | None,
    calibration_data: Any,
    dynamic_batch: bool,
    options: Mapping[str, Any] | None,
    progress: bool | None,
) -> Settings:
    merged = dict(options or {})
    clash = sorted({"precision", "quantize", "calibration_data", "dynamic_batch"} & set(merged))
    if clash:
        raise ExportArgumentError(f"pass {clash} as export() arguments, not in options")
    merged.update(quantize=quantize, calibration_data=calibration_data, dynamic_batch=dynamic_batch)
    if precision is not None:
        merged["precision"] = precision
    if progress is not None:
        merged.setdefault("progress", progress)
    try:
        return runtime_settings(merged)
    except ValueError as exc:
        raise ExportArgumentError(str(exc)) from exc


def check_arguments(
    model: Any, example_inputs: Any, path: str | os.PathLike[str], opset: Any
) -> tuple[torch.Tensor, ...]:
    """Refuse a model, inputs, path or opset export cannot take; the inputs as a tuple."""
    if not isinstance(model, nn.Module):
        raise ExportArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise ExportArgumentError(
            f"{type(model).__name__} is in training mode; call model.eval() before export "
            "(BatchNorm statistics and Dropout must be fixed for a deployable file)"
        )
    args = _as_args(example_inputs)
    path = Path(path)
    if path.suffix != ".onnx":
        raise ExportArgumentError(f"path must end in .onnx, got {str(path)!r}")
    if not path.parent.is_dir():
        raise ExportArgumentError(f"directory {str(path.parent)!r} does not exist; create it first")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write to directory {str(path.parent)!r}; choose a writable path")
    try:
        refuse_foreign_sidecar(sidecar_path(path))
    except FileExistsError as exc:
        raise ExportArgumentError(str(exc)) from exc
    if opset is not None and (
        isinstance(opset, bool)
        or not isinstance(opset, int)
        or not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version()
    ):
        raise ExportArgumentError(
            f"invalid opset={opset!r}: this onnx writes opsets {MIN_OPSET} to "
            f"{onnx.defs.onnx_opset_version()} (QuantizeLinear per channel needs {MIN_OPSET}); "
            "leave it None for the exporter's default"
        )
    return args


def export_target(backend: str | Backend) -> Backend:
    try:
        return as_backend(backend)
    except (TypeError, ValueError) as exc:
        raise ExportArgumentError(str(exc)) from exc


def check_calibration(
    settings: Settings, target: Backend, backend: str | Backend, args: tuple[torch.Tensor, ...]
) -> None:
    """Refuse calibration data that does not fit, or INT8 for a target without it."""
    data = settings.calibration_data
    mismatch = calibration_mismatch(data, args) if data is not None else ""
    if mismatch:
        raise ExportArgumentError(
            f"calibration_data does not fit the model's inputs: {mismatch}; give batches shaped "
            "like example_inputs"
        )
    if settings.precision.quantizes and target.quantization is None:
        raise ExportArgumentError(
            f"backend {backend!r} has no INT8 configuration; use backend='tensorrt' or "
            f"'onnxruntime' for precision={settings.precision.name!r}"
        )
