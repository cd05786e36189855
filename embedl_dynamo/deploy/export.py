"""Ahead-of-time export: the ``torch.compile`` pipeline, written to a file you can ship.

``torch.compile`` output lives only in the process that compiled it. :func:`export` runs the
very same stages the ``embedl_*`` dynamo backends run (it calls them, it does not copy them):

1. :func:`~embedl_dynamo.graph.capture.capture`: Dynamo capture of one graph, weights frozen,
   in-place ops made functional;
2. :func:`~embedl_dynamo.deploy.export_guards.check_export_graph`: that graph judged by the
   conformance table, as ``torch.compile`` partitions it: for the ``onnxruntime`` and
   ``openvino`` targets an op the file's runtime does not compute as PyTorch does is an
   :class:`~embedl_dynamo.errors.ExportError` (one file cannot keep it in PyTorch); a graph
   with index ops gets the index flag output (:mod:`~embedl_dynamo.deploy.index_flag`);
3. :func:`~embedl_dynamo.tuning.precision_form.transform_for`: conversions, fusions and, with
   ``quantize="int8"``, QDQ insertion calibrated through the same on-disk calibration cache,
   then the precision's form measured on the file's runtime (``mixed``'s layers, a half
   precision's typed or hinted graph on OpenVINO);
4. :func:`~embedl_dynamo.onnx.export.export_onnx`: one ONNX file, weights (and weight scales) as
   initializers, a dynamic batch axis;

then verifies the file (``onnx.checker``, then ONNX Runtime judged by the verdict
``torch.compile`` applies, :mod:`embedl_dynamo.tuning.judge`, plus a doubled batch) and writes
a JSON sidecar next to it (``model.onnx`` -> ``model.json``): the plan report, the quantization
scales, the layers left in float and why, the verification, the guards ``load()`` applies
(NaN and infinite inputs where a listed difference needs it, the index flag), the settings and
the library versions. Each stage is one function below; :func:`export` runs them in order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedl_dynamo.backend import Backend
from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import atomic_write_text
from embedl_dynamo.cache.keys import jsonable
from embedl_dynamo.deploy.engine import build_engine_file
from embedl_dynamo.deploy.export_arguments import (
    MIN_OPSET,
    check_arguments,
    check_calibration,
    export_settings,
    export_target,
)
from embedl_dynamo.deploy.export_file import (
    ExportStages,
    build_sidecar,
    verification_message,
    write_verified,
)
from embedl_dynamo.deploy.export_guards import ExportGuards, check_export_graph
from embedl_dynamo.deploy.file_recipe import recipe_entries, recording
from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT
from embedl_dynamo.deploy.sidecar import (
    SIDECAR_FORMAT,
    export_runtime,
    runtime_record,
    sidecar_path,
    write_report_page,
)
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.deploy.verify import Verification
from embedl_dynamo.errors import ExportArgumentError, ExportError
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.output_tree import OUTPUT_TREE_META, OutputTree
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import flat_outputs
from embedl_dynamo.tuning.precision_form import transform_for

__all__ = [
    "MIN_OPSET",
    "SIDECAR_FORMAT",
    "export",
    "sidecar_path",
]

logger = logging.getLogger(__name__)


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
        path: the ``.onnx`` file to write (its directory must exist); its sidecar: ``model.json``.
        backend: the target whose patterns are used: a name (``tensorrt``, ``onnxruntime``,
            ...) or a [Backend][embedl_dynamo.Backend].
        precision: ``fp32``, ``fp16``/``bf16`` (normalisation, softmax, reductions and outputs
            stay fp32), ``int8`` (QDQ nodes, int8 weights) or ``mixed`` (INT8 per layer where it
            pays within ``accuracy_budget``); None: ``EMBEDL_DYNAMO_PRECISION``, else ``fp32``.
        quantize: the older spelling of ``precision="int8"``.
        calibration_data: INT8 calibration batches (tensors or tuples) or a callable
            ``forward_loop(model)``; the example inputs when None.
        dynamic_batch: leave dim 0 dynamic (``batch``) in the file.
        dynamic_shapes: more dynamic axes, one ``None`` or ``{axis: name}`` per input, as
            ``torch.export`` takes them (``[{1: "seq"}]``); the sidecar names them.
        opset: ONNX opset; the exporter's default when None.
        verify: raise [VerificationError][embedl_dynamo.VerificationError] when the file fails
            the verdict ``torch.compile`` gives; the sidecar reports it either way.
        engine: also build a TensorRT engine (``model.engine``); needs TensorRT and a GPU.
        tolerance: a float file's bound relative to the output scale (default
            `embedl_dynamo.tuning.judge.FLOAT_RTOL`, as for ``torch.compile``); a lower
            precision is held to ``accuracy_budget`` (set it in ``options``).
        options: further pipeline settings, as ``torch.compile(..., options=...)`` takes them.
        progress: show a progress bar over the export stages (None: only on a terminal).
        html: also write the compile report as one page beside the sidecar (``model.html``).
        triton_repository: also write a Triton model repository in this directory.

    Returns:
        The path of the ONNX file.

    Raises:
        ExportError: bad arguments, a model Dynamo cannot capture, an op ONNX cannot express,
            or an op the conformance table keeps in PyTorch on the file's runtime.
        VerificationError: ``verify`` is on and the file fails the verdict.

    Example:
        ```python
        embedl_dynamo.export(model.eval(), (x,), "model.onnx", backend="openvino", precision="int8")
        ```
    """
    args = check_arguments(model, example_inputs, path, opset)
    path, target = Path(path), export_target(backend)
    settings = export_settings(
        precision, quantize, calibration_data, dynamic_batch, options, progress
    )
    check_calibration(settings, target, backend, args)
    runtime = export_runtime(target.name, settings.runtime)
    shapes, checks = (dynamic_batch, dynamic_shapes), (opset, verify, tolerance, engine)
    built, stages = _build_file(model, args, path, target, settings, shapes, checks)
    gm, guards, result, outputs, written, engine_path, refit_entries = built
    sidecar = build_sidecar(
        path, target, args, outputs, result, settings, written, stages.timings, guards
    )
    count = len(outputs) - bool(guards.index_ops)  # the model's own outputs
    sidecar.update(_deployment(path, runtime, gm, count, engine_path), **refit_entries)
    _write_sidecar(path, sidecar, engine_path, target, result, html, stages, triton_repository)
    _warn_index_flag(path, guards, triton_repository)
    return path


def _build_file(
    model: nn.Module,
    args: tuple[Any, ...],
    path: Path,
    target: Backend,
    settings: Settings,
    shapes: tuple[bool, Sequence[Mapping[int, str] | None] | None],
    checks: tuple[int | None, bool, float | None, bool],
) -> tuple[tuple[Any, ...], ExportStages]:
    """Capture, check against the table, run the pipeline, write and verify the file (and the
    engine): ``(graph, guards, pipeline result, outputs, written, engine path, the sidecar's
    refit entries)``, and the stages with their timings."""
    opset, verify, tolerance, engine = checks
    runtime = export_runtime(target.name, settings.runtime)
    stages = ExportStages(4 + int(engine), settings.progress)
    try:
        with stages.run("capture"):
            gm = _capture(model, args, *shapes)
            guards = check_export_graph(gm, target.name, runtime)  # what the table allows
        with stages.run("pipeline"), recording(guards.graph) as recorder:  # for refit()
            runtime_cls = _form_runtime(target)
            result = transform_for(guards.graph, args, target, settings, runtime_cls)
        outputs, eager = _outputs(result, args), _in_graph_order(model, gm)
        written = write_verified(
            path,
            eager,
            args,
            result,
            settings,
            stages,
            opset,
            verify,
            tolerance,
            target.name,
            guards,
        )
        _log_verification(path, written[0], settings)
        refit_entries = recipe_entries(path, recorder, result, guards.graph, model)
        engine_path = _engine(path, args, settings, stages) if engine else None
    finally:
        stages.close()
    return (gm, guards, result, outputs, written, engine_path, refit_entries), stages


def _deployment(
    path: Path, runtime: str, gm: Any, count: int, engine_path: Path | None
) -> dict[str, Any]:
    """The sidecar's entries on how the file deploys: the engine built beside it, the runtime
    it is meant to run on (``load()`` runs it there) and the model's output structure."""
    return {
        "engine_file": engine_path.name if engine_path else None,
        "engine_sha256": sha256_file(engine_path) if engine_path else None,
        "runtime": runtime_record(runtime, path),
        "output_tree": _output_tree(path, gm.meta.get(OUTPUT_TREE_META), count),
    }


def _warn_index_flag(
    path: Path, guards: ExportGuards, triton_repository: str | os.PathLike[str] | None
) -> None:
    """Say that the file's last output is the index flag, which a runtime other than
    ``load()``'s module (Triton, a session of its own) hands back for its caller to read."""
    if not guards.index_ops:
        return
    where = f"; the Triton model in {triton_repository} returns it" if triton_repository else ""
    logger.warning(
        "%s: its last output %s is True when an index of the call is outside the range PyTorch "
        "takes (%s), where PyTorch raises IndexError; load() raises it, but a client running "
        "the file otherwise must read that output and refuse the answer%s",
        path.name,
        INDEX_FLAG_OUTPUT,
        ", ".join(guards.index_ops),
        where,
    )


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
    logger.warning(
        "%s: load() returns the outputs as a flat tuple, not in the model's structure: %s",
        path.name,
        why,
    )
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
        logger.warning(
            "%s: %d problem(s) for TensorRT's parser, first: %s (all in the sidecar's "
            "tensorrt_lint)",
            path.name,
            len(lint),
            lint[0],
        )
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
        path,
        check.max_abs_diff,
        check.compared_with,
        "passed" if check.passed else "failed",
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


def _form_runtime(target: Backend) -> type[Runtime]:
    """The runtime the precision's form (``mixed``'s choice, the half form) is measured on: the
    installed CPU runtime whose placement the target is (OpenVINO for the openvino target),
    else ONNX Runtime."""
    for runtime in runtime_classes().values():
        if runtime.cpu_target == target and runtime.is_available():
            return runtime
    return OnnxRuntime
