"""Ahead-of-time export: the ``torch.compile`` pipeline, written to a file you can ship.

``torch.compile`` output lives only in the process that compiled it. :func:`export` runs the
very same stages the ``embedl_*`` dynamo backends run (it calls them, it does not copy them):

1. :func:`~embedl_dynamo.graph.capture.capture`: Dynamo capture of one graph, weights frozen;
2. :func:`~embedl_dynamo.pipeline.run_pipeline`: conversions, fusions and, with
   ``quantize="int8"``, QDQ insertion calibrated through the same on-disk calibration cache;
3. :func:`~embedl_dynamo.onnx.export.export_onnx`: one ONNX file, weights (and weight scales) as
   initializers, a dynamic batch axis;

then verifies the file (``onnx.checker``, then ONNX Runtime judged by the verdict
``torch.compile`` applies, :mod:`embedl_dynamo.tuning.judge`, plus a doubled batch) and writes
a JSON sidecar next to it (``model.onnx`` -> ``model.json``): the plan report, the quantization
scales, the layers left in float and why, the verification, the settings and the library
versions. Each stage is one function below; :func:`export` runs them in order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from embedl_dynamo.backend import Backend, as_backend
from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import (
    atomic_write_text,
)
from embedl_dynamo.cache.keys import jsonable
from embedl_dynamo.deploy.engine import build_engine_file
from embedl_dynamo.deploy.export_file import (
    ExportStages,
    build_sidecar,
    verification_message,
    write_verified,
)
from embedl_dynamo.deploy.sidecar import (
    SIDECAR_FORMAT,
    export_runtime,
    refuse_foreign_sidecar,
    runtime_record,
    sidecar_path,
    write_report_page,
)
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.deploy.verify import Verification
from embedl_dynamo.errors import ExportArgumentError, ExportError
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.output_tree import OUTPUT_TREE_META, OutputTree
from embedl_dynamo.pipeline import PipelineResult, run_pipeline
from embedl_dynamo.quant.calibrate import calibration_mismatch
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_classes, runtime_settings
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.half_form import choose_half_form
from embedl_dynamo.tuning.judge import flat_outputs
from embedl_dynamo.tuning.mixed_precision import apply_mixed

__all__ = [
    "MIN_OPSET",
    "SIDECAR_FORMAT",
    "export",
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
    dynamic_shapes: Sequence[Mapping[int, str] | None] | None = None,
    opset: int | None = None,
    verify: bool = True,
    engine: bool = False,
    tolerance: float | None = None,
    options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    html: bool = False,
    triton_repository: str | os.PathLike[str] | None = None,
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
        dynamic_shapes: more dynamic axes, one ``None`` or ``{axis: name}`` per input, as
            ``torch.export`` takes them (``[{1: "seq"}]``); the sidecar names them.
        opset: ONNX opset; the exporter's default when None.
        verify: raise :class:`VerificationError` when the file fails ``torch.compile``'s
            verdict (:mod:`embedl_dynamo.tuning.judge`); the sidecar reports it either way.
        engine: also build a TensorRT engine (``model.engine``); needs TensorRT and a GPU.
        tolerance: a float file's bound relative to the output scale (default
            :data:`~embedl_dynamo.tuning.judge.FLOAT_RTOL`, as for ``torch.compile``); a lower
            precision is held to ``accuracy_budget`` (set it in ``options``).
        options: further pipeline settings (``observer``, ``calibration_steps``, ``cache_dir``,
            ...), as for ``torch.compile(..., options=...)``.
        progress: show a progress bar over the export stages (None: only on a terminal).
        html: also write the compile report as one page beside the sidecar (``model.html``).
        triton_repository: also write a Triton model repository there (:mod:`.triton`).

    Returns:
        The path of the ONNX file.

    Raises:
        ExportError: bad arguments, a model Dynamo cannot capture, an op ONNX cannot express.
        VerificationError: ``verify`` is on and the file fails the verdict.
    """
    args = _check_arguments(model, example_inputs, path, opset)
    path, target = Path(path), _target(backend)
    settings = _settings(precision, quantize, calibration_data, dynamic_batch, options, progress)
    _check_calibration(settings, target, backend, args)
    stages = ExportStages(4 + int(engine), settings.progress)
    try:
        with stages.run("capture"):
            gm = _capture(model, args, dynamic_batch, dynamic_shapes)
        with stages.run("pipeline"):
            result = _pipeline(gm, args, target, settings)
        outputs, eager = _outputs(result, args), _in_graph_order(model, gm)
        written = write_verified(path, eager, args, result, settings, stages, opset, verify,
                                 tolerance, target.name)  # fmt: skip
        _log_verification(path, written[0], settings)
        engine_path = _engine(path, args, settings, stages) if engine else None
    finally:
        stages.close()
    sidecar = build_sidecar(path, target, args, outputs, result, settings, written, stages.timings)
    sidecar.update(_deployment(path, target, settings, gm, len(outputs), engine_path))
    _write_sidecar(path, sidecar, engine_path, target, result, html, stages, triton_repository)
    return path


def _deployment(
    path: Path,
    target: Backend,
    settings: Settings,
    gm: Any,
    count: int,
    engine_path: Path | None,
) -> dict[str, Any]:
    """The sidecar's entries on how the file deploys: the engine built beside it, the runtime
    it is meant to run on (``load()`` runs it there) and the model's output structure."""
    return {
        "engine_file": engine_path.name if engine_path else None,
        "engine_sha256": sha256_file(engine_path) if engine_path else None,
        "runtime": runtime_record(export_runtime(target.name, settings.runtime), path),
        "output_tree": _output_tree(path, gm.meta.get(OUTPUT_TREE_META), count),
    }


def _in_graph_order(model: nn.Module, gm: Any) -> Callable[..., Any]:
    """``model``, returning its outputs as the file does, where capture recorded their
    structure (in ``gm``): the graph's outputs in their order (no ``None``, numbers or
    returned inputs), so the verification compares like with like."""
    tree = gm.meta.get(OUTPUT_TREE_META)
    if not isinstance(tree, OutputTree) or not tree.covers_outputs:
        return model
    return lambda *inputs: tree.graph_outputs(model(*inputs))


def _output_tree(path: Path, tree: OutputTree | str | None, count: int) -> dict[str, Any] | None:
    """The sidecar's ``output_tree``: the captured model's output structure, which ``load()``
    rebuilds (None, with one warning, where it could not be recorded)."""
    if isinstance(tree, OutputTree) and tree.count == count:
        return tree.to_dict()
    why = tree if isinstance(tree, str) else "the pipeline changed the number of outputs"
    logger.warning("%s: load() returns the outputs as a flat tuple, not in the model's "
                   "structure: %s", path.name, why)  # fmt: skip
    return None


def _engine(
    path: Path, args: tuple[torch.Tensor, ...], settings: Settings, stages: ExportStages
) -> Path:
    """Build the TensorRT engine beside the file (``model.engine``)."""
    with stages.run("engine", timed=False):
        return build_engine_file(path, args, settings)


def _outputs(result: PipelineResult, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The pipeline model's outputs on ``args``, flat; only tensors can be exported."""
    with torch.no_grad():
        out = result.model(*args)
    try:
        return flat_outputs(out)
    except TypeError as exc:
        raise ExportError(f"{exc}; export needs tensor outputs") from exc


def _write_sidecar(
    path: Path,
    sidecar: dict[str, Any],
    engine_path: Path | None,
    target: Backend,
    result: PipelineResult,
    html: bool,
    stages: ExportStages,
    triton_repository: str | os.PathLike[str] | None,
) -> None:
    """Warn about TensorRT lint, write the HTML page when asked, then the sidecar (naming the
    engine file), then the Triton model repository when asked."""
    sidecar["engine_file"] = engine_path.name if engine_path else None
    if sidecar["tensorrt_lint"]:
        lint = sidecar["tensorrt_lint"]
        logger.warning("%s: %d problem(s) for TensorRT's parser, first: %s (all in the sidecar's "
                       "tensorrt_lint)", path.name, len(lint), lint[0])  # fmt: skip
    if html:
        seconds = time.perf_counter() - stages.start
        sidecar["html_file"] = write_report_page(path, target.name, result, seconds).name
    atomic_write_text(sidecar_path(path), json.dumps(jsonable(sidecar, default=repr), indent=2))
    if triton_repository is not None:
        write_triton_repository(path, triton_repository)


def _log_verification(path: Path, check: Verification, settings: Settings) -> None:
    if not check.passed:
        logger.warning("%s; kept because verify=False", verification_message(path, check, settings))
    logger.info(
        "exported %s: max abs diff %.3g vs %s, %s",
        path, check.max_abs_diff, check.compared_with, "passed" if check.passed else "failed",
    )  # fmt: skip


def _check_arguments(
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


def _target(backend: str | Backend) -> Backend:
    try:
        return as_backend(backend)
    except (TypeError, ValueError) as exc:
        raise ExportArgumentError(str(exc)) from exc


def _check_calibration(
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


def _capture(
    model: nn.Module,
    args: tuple[torch.Tensor, ...],
    dynamic_batch: bool,
    dynamic_shapes: Sequence[Mapping[int, str] | None] | None,
) -> Any:
    """Dynamo's one graph of ``model``; a graph break names the way out."""
    try:
        return capture(model, args, dynamic_batch=dynamic_batch, dynamic_shapes=dynamic_shapes)
    except ValueError as exc:  # the model rejects the example inputs
        raise ExportArgumentError(str(exc)) from exc
    except RuntimeError as exc:
        raise ExportError(
            f"{exc}. Export needs one graph: remove the graph break (see "
            "torch._dynamo.explain) or export the parts separately."
        ) from exc


def _mixed_runtime(target: Backend) -> type[Runtime]:
    """The runtime ``mixed`` measures on: the installed CPU runtime whose placement the target
    is (OpenVINO for the openvino target), else ONNX Runtime."""
    for runtime in runtime_classes().values():
        if runtime.cpu_target == target and runtime.is_available():
            return runtime
    return OnnxRuntime


def _pipeline(
    gm: Any, args: tuple[torch.Tensor, ...], target: Backend, settings: Settings
) -> PipelineResult:
    """The ``torch.compile`` pipeline (and ``mixed``'s choice, measured on the target's
    runtime)."""
    if not settings.precision.per_layer:
        return _half_form(gm, args, run_pipeline(gm, args, target, settings), target, settings)
    result = run_pipeline(gm, args, target, settings.float_copy())
    return apply_mixed(result, args, target.quantizer, settings, runtime=_mixed_runtime(target))


def _half_form(
    gm: Any,
    args: tuple[torch.Tensor, ...],
    result: PipelineResult,
    target: Backend,
    settings: Settings,
) -> PipelineResult:
    """``result``, for a half precision on a target whose CPU runtime has two forms of it
    (OpenVINO: :func:`~embedl_dynamo.tuning.half_form.choose_half_form`), in the form that
    runtime ran faster here within the budget: the typed graph, or the float graph whose file
    asks for the half type (:mod:`~embedl_dynamo.graph.rest_precision`). The report's
    ``half_form`` says which and why."""
    choice = choose_half_form(
        result.model, result.float_model, _mixed_runtime(target), gm, list(args), settings
    )
    if choice is None:
        return result
    choice.runtime.deactivate()
    report = dict(result.report, half_form=choice.note)
    return PipelineResult(choice.option.model, result.plan, report, result.float_model)
