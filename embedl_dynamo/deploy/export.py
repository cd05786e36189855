"""Ahead-of-time export: the ``torch.compile`` pipeline, written to a file you can ship.

``torch.compile`` output lives only in the process that compiled it. :func:`export` runs the
very same stages the ``embedl_*`` dynamo backends run (it calls them, it does not copy them):

1. :func:`~embedl_dynamo.graph.capture.capture`: Dynamo capture of one graph, weights frozen;
2. :func:`~embedl_dynamo.pipeline.run_pipeline`: conversions, fusions and, with
   ``quantize="int8"``, QDQ insertion calibrated through the same on-disk calibration cache;
3. :func:`~embedl_dynamo.onnx.export.export_onnx`: one ONNX file, weights (and weight scales) as
   initializers, a dynamic batch axis;

then validates the file (``onnx.checker``, one ONNX Runtime run compared with PyTorch) and writes
a JSON sidecar next to it (``model.onnx`` -> ``model.json``): the plan report, the quantization
scales, the layers left in float and why, the settings and the library versions.

Verification compares like with like. A float export is compared with the user's eager model; an
INT8 export with the fake-quant PyTorch graph the pipeline produced (the same arithmetic), and
its distance to the float model is reported too (cosine similarity), since INT8 is not meant to
equal float.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from embedl_dynamo.backend import Backend, as_backend
from embedl_dynamo.cache.files import (
    atomic_write_text,
    file_mode,
)
from embedl_dynamo.cache.keys import jsonable, library_versions, sha256_file
from embedl_dynamo.deploy.engine import build_engine_file
from embedl_dynamo.deploy.sidecar import (
    SIDECAR_FORMAT,
    io_specs,
    refuse_foreign_sidecar,
    sidecar_path,
    write_report_page,
)
from embedl_dynamo.deploy.verify import (
    flat_outputs,
    float_tolerance,
    int8_tolerance,
    verify_onnx,
)
from embedl_dynamo.errors import (
    ExportArgumentError,
    ExportError,
    VerificationError,
)
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.onnx.export import export_onnx, input_names, output_names
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.quant.calibrate import calibration_mismatch
from embedl_dynamo.runtimes.registry import runtime_classes, runtime_lint, runtime_settings
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.mixed_precision import apply_mixed

__all__ = [
    "MIN_OPSET",
    "SIDECAR_FORMAT",
    "export",
    "float_tolerance",
    "int8_tolerance",
    "sidecar_path",
]

logger = logging.getLogger(__name__)

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


def _settings(
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


def export(
    model: nn.Module,
    example_inputs: Any,
    path: str | os.PathLike[str],
    *,
    backend: str | Backend = "tensorrt",
    precision: str | None = None,
    quantize: str | None = None,
    calibration_data: Iterable[Any] | Callable[[nn.Module], Any] | None = None,
    dynamic_batch: bool = True,
    opset: int | None = None,
    verify: bool = True,
    engine: bool = False,
    tolerance: float | None = None,
    options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    html: bool = False,
) -> Path:
    """Run the ``torch.compile`` pipeline ahead of time and write an ONNX file plus JSON sidecar.

    Args:
        model: an ``nn.Module`` in eval mode; it is run, never modified.
        example_inputs: a tensor or a tuple of tensors (batch dimension first).
        path: the ``.onnx`` file to write (its directory must exist); the sidecar goes to
            :func:`sidecar_path` (``model.json``).
        backend: the target whose patterns are used: a name (``tensorrt``, ``onnxruntime``,
            ...) or a :class:`~embedl_dynamo.backend.Backend`.
        precision: ``fp32``, ``fp16``/``bf16`` (half types in the file, with normalisation,
            softmax, reductions and outputs in fp32), ``int8`` (QDQ nodes, int8 weights) or
            ``mixed`` (INT8 per layer where it pays within ``accuracy_budget``); None reads
            ``EMBEDL_DYNAMO_PRECISION``, else ``fp32``.
        quantize: the older spelling of ``precision="int8"``.
        calibration_data: INT8 calibration batches (tensors or tuples) or a callable
            ``forward_loop(model)``; the example inputs when None.
        dynamic_batch: leave dim 0 dynamic (``batch``) in the file.
        opset: ONNX opset; the exporter's default when None.
        verify: raise :class:`VerificationError` when ONNX Runtime's outputs differ from
            PyTorch's beyond tolerance (the difference is always measured and reported).
        engine: also build a TensorRT engine (``model.engine``); needs TensorRT and a GPU.
        tolerance: overrides :func:`float_tolerance` / :func:`int8_tolerance`.
        options: further pipeline settings (``observer``, ``calibration_steps``, ``cache_dir``,
            ...), as for ``torch.compile(..., options=...)``.
        progress: show a progress bar over the export stages (None: only on a terminal).
        html: also write the compile report as one self-contained page next to the sidecar
            (``model.html``): the plan, each layer's precision and why, latencies measured.

    Returns:
        The path of the ONNX file.

    Raises:
        ExportError: bad arguments, a model Dynamo cannot capture as one graph, or an op ONNX
            cannot express; the message names the cause and the fix.
        VerificationError: ``verify`` is on and the outputs differ beyond tolerance.
    """
    from tqdm.auto import tqdm

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
    try:
        target = as_backend(backend)
    except (TypeError, ValueError) as exc:
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
    settings = _settings(precision, quantize, calibration_data, dynamic_batch, options, progress)
    mismatch = calibration_mismatch(calibration_data, args) if calibration_data is not None else ""
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

    show = settings.progress
    stages = tqdm(
        total=4 + int(engine),
        desc="export",
        unit="stage",
        disable=None if show is None else not show,  # None: only on a terminal
        leave=False,
    )
    timings: dict[str, float] = {}
    start = time.perf_counter()
    try:
        stages.set_postfix_str("capture")
        try:
            gm = capture(model, args, dynamic_batch=dynamic_batch)
        except ValueError as exc:  # the model rejects the example inputs
            raise ExportArgumentError(str(exc)) from exc
        except RuntimeError as exc:
            raise ExportError(
                f"{exc}. Export needs one graph: remove the graph break (see "
                "torch._dynamo.explain) or export the parts separately."
            ) from exc
        timings["capture_s"] = time.perf_counter() - start
        stages.update()

        stages.set_postfix_str("pipeline")
        t0 = time.perf_counter()
        if settings.precision.per_layer:
            result = run_pipeline(gm, args, target, settings.float_copy())
            result = apply_mixed(result, args, target.quantizer, settings)
        else:
            result = run_pipeline(gm, args, target, settings)
        timings["pipeline_s"] = time.perf_counter() - t0
        stages.update()

        stages.set_postfix_str("onnx")
        t0 = time.perf_counter()
        with torch.no_grad():
            outputs = flat_outputs(result.model(*args))
        # everything is written beside the target first and renamed into place only once it
        # verifies, so a failed export never destroys a file that was there before
        try:
            fd, tmp_name = tempfile.mkstemp(
                prefix=f".{path.stem}.", suffix=".onnx", dir=path.parent
            )
        except OSError as exc:
            raise ExportError(
                f"cannot write to directory {str(path.parent)!r} ({exc.strerror}); "
                "choose a writable path"
            ) from exc
        os.chmod(tmp_name, file_mode())  # like any file the user writes: honour the umask
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            try:
                export_onnx(result.model, args, tmp, dynamic_batch=dynamic_batch, opset=opset)
                onnx.checker.check_model(str(tmp))
            except ExportError as exc:
                raise ExportError(
                    f"{exc}. The op stays in PyTorch under torch.compile; for export, replace "
                    "it or raise the opset (opset=...)"
                ) from exc
            timings["onnx_s"] = time.perf_counter() - t0
            stages.update()

            stages.set_postfix_str("verify")
            t0 = time.perf_counter()
            quantized = bool(result.report.get("quantized"))
            reference = result.model if result.model is not result.float_model else model
            check = verify_onnx(
                tmp, args, reference, model, settings.precision, dynamic_batch, tolerance
            )
            timings["verify_s"] = time.perf_counter() - t0
            stages.update()
            # a lower-precision file also passes on what torch.compile accepts: its cosine to the
            # float model within accuracy_budget (integer kernels round ties their own way, and
            # on a large output the max abs difference to the fake-quant graph adds up)
            within_budget = (
                check.cosine_to_float is not None
                and check.cosine_to_float >= settings.accuracy_budget
            )
            passed = check.max_abs_diff <= check.tolerance or within_budget
            message = (
                f"{path.name} differs from PyTorch by {check.max_abs_diff:.3g} (max abs, vs the "
                f"{check.compared_with}; tolerance {check.tolerance:.3g})"
            )
            if check.cosine_to_float is not None:
                message += (
                    f", cosine {check.cosine_to_float:.4f} to the float model (accuracy_budget "
                    f"{settings.accuracy_budget})"
                )
            if not passed and verify:
                raise VerificationError(
                    f"{message}. Nothing was written (files already at {path.name} are "
                    "untouched); disable the plan entry at fault, or pass verify=False to write "
                    "the file anyway."
                )
            written_opset = next(
                (o.version for o in onnx.load(str(tmp), load_external_data=False).opset_import
                 if o.domain in ("", "ai.onnx")),
                None,
            )  # fmt: skip
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        if not passed:
            logger.warning("%s; kept because verify=False", message)
        logger.info(
            "exported %s: max abs diff %.3g vs %s (tolerance %.3g)",
            path, check.max_abs_diff, check.compared_with, check.tolerance,
        )  # fmt: skip

        engine_path = None
        if engine:
            stages.set_postfix_str("engine")
            engine_path = build_engine_file(path, args, settings)
            stages.update()
    finally:
        stages.close()

    batch = args[0].shape[0] if args[0].dim() > 0 else None
    quant_report = result.report.get("quantization") or {}
    sidecar = {
        "format": SIDECAR_FORMAT,
        "onnx_file": path.name,
        "onnx_sha256": sha256_file(path),
        "engine_file": engine_path.name if engine_path else None,
        "backend": target.to_dict(),
        "inputs": io_specs(input_names(len(args)), args, batch, dynamic_batch),
        "outputs": io_specs(output_names(len(outputs)), outputs, batch, dynamic_batch),
        "opset": written_opset,
        "tensorrt_lint": runtime_lint(target, onnx.load(str(path))),
        "precision": settings.precision.name,
        "quantized": quantized,
        "layers": result.report.get("layers", []),
        "plan": result.plan.summary(),
        "report": {k: v for k, v in result.report.items() if k != "quantization"},
        "quantization": {
            "scales": quant_report.get("ranges"),
            "quantized_layers": quant_report.get("quantized_layers", []),
            "float_layers": quant_report.get("float_layers", []),
            "ranges_from": quant_report.get("ranges_from"),
            "config": quant_report.get("config"),
        }
        if quantized
        else None,
        "verification": {
            "max_abs_diff": check.max_abs_diff,
            "tolerance": check.tolerance,
            "compared_with": check.compared_with,
            "batch_sizes": list(check.batch_sizes),
            "cosine_to_float": check.cosine_to_float,
            "passed": passed,
        },
        "settings": settings.to_dict(),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "versions": library_versions(runtime_classes().values()),
    }
    if sidecar["tensorrt_lint"]:
        lint = sidecar["tensorrt_lint"]
        logger.warning("%s: %d problem(s) for TensorRT's parser, first: %s (all in the sidecar's "
                       "tensorrt_lint)", path.name, len(lint), lint[0])  # fmt: skip
    if html:
        seconds = time.perf_counter() - start
        sidecar["html_file"] = write_report_page(path, target.name, result, seconds).name
    atomic_write_text(sidecar_path(path), json.dumps(jsonable(sidecar, default=repr), indent=2))
    return path
