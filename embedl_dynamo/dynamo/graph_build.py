"""Build one frozen, functional graph on its runtime: warm start, pipeline, runtime, judge.

The stage both a whole Dynamo subgraph and each fragment of a partitioned one go through
(:mod:`embedl_dynamo.dynamo.compile`, :mod:`embedl_dynamo.dynamo.partitioned`):

1. a warm start loads what an earlier build of the same graph stored, without running the
   pipeline (:mod:`embedl_dynamo.dynamo.warm_start`);
2. :func:`~embedl_dynamo.tuning.precision_form.transform_for` (the pipeline, then ``mixed``'s
   choice), then the runtime is built through the artifact cache (a half precision's form
   chosen there) and its artifact judged against the graph;
3. if the pipeline or the runtime fails, ``fallback="eager"`` leaves the graph in PyTorch and
   the report says why; ``fallback="raise"`` raises;
4. under ``runtime="auto"``, a runtime timed no faster than PyTorch running the graph leaves it
   in PyTorch (:mod:`embedl_dynamo.tuning.beat_eager`);
5. the per-call guards the runtime needs wrap its infer (:mod:`embedl_dynamo.dynamo.call_guards`).

INT8 without calibration data calibrates on the first real calls.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from torch import fx

from embedl_dynamo.dynamo.call_guards import guard_call
from embedl_dynamo.dynamo.compiled_call import (
    calibrated_input_bounds,
    watch_calibrated_ranges,
)
from embedl_dynamo.dynamo.refit_recipe import record_transform
from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
from embedl_dynamo.dynamo.warm_start import alias_key_of, remember_build, start_warm
from embedl_dynamo.errors import CalibrationDataError, error_line
from embedl_dynamo.graph.index_guards import guard_indices
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.quant.int8.calibrate import calibration_mismatch, fit_batches_to_graph
from embedl_dynamo.quant.int8.lazy import calibrate_then_build
from embedl_dynamo.report.record import record
from embedl_dynamo.report.subgraph import LOWER_REJECTED
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.beat_eager import times_eager
from embedl_dynamo.tuning.half_form import choose_half_form
from embedl_dynamo.tuning.int8_speed import compare_with_float
from embedl_dynamo.tuning.judge import (
    check_float_sample,
    check_precision,
    judge_against,
    judging_sample,
)
from embedl_dynamo.tuning.precision_form import transform_for
from embedl_dynamo.tuning.runtime_choice import fastest, run_options

__all__ = ["build_graph", "warn_failed"]

logger = logging.getLogger(__name__)

_COLLECT_BYTES = 256 * 2**20  # frozen weights above which a compile collects its garbage


def build_graph(job: SubgraphJob, graph: fx.GraphModule) -> Callable[..., Any] | None:
    """The runtime's infer for ``graph`` (frozen, functional: ``job.original``, on
    ``job.inputs``), guarded per call; None where the graph runs in PyTorch (the reason in
    ``job.report``, which is recorded)."""
    index_guard = guard_indices(graph)
    if index_guard is not None:  # the graph also says when an index leaves PyTorch's range
        graph = job.original = index_guard.graph
        job.axes = dataclasses.replace(job.axes, outputs=(*job.axes.outputs, {}))
    alias_key = alias_key_of(job, graph)
    warm = start_warm(job, graph, alias_key) if alias_key is not None else None
    if warm is not None:  # its infer is None where eager beat the runtimes
        infer = warm.infer
    else:
        infer = _build_new(job, graph, alias_key)
    return guard_call(infer, graph, job.report, job.settings, index_guard)


def _build_new(
    job: SubgraphJob, graph: fx.GraphModule, alias_key: str | None
) -> Callable[..., Any] | None:
    """The pipeline and the runtime's build for ``graph`` (nothing found in the cache)."""
    job.settings = _fit_calibration(job, graph)
    result = record_transform(job, graph, _transform)  # its weight recipe kept for a refit
    if result is None:
        job.stay_eager("eager", job.report.reason, None)
        return None
    infer = _build_stage(job, result, alias_key)
    _finish(job, alias_key)
    del result  # its graphs are reference cycles holding integer or half weights (an LLM's):
    if sum(t.nbytes for t in graph.buffers()) > _COLLECT_BYTES:  # free them before the next
        gc.collect()
    return infer


def _fit_calibration(job: SubgraphJob, frozen: fx.GraphModule) -> Settings:
    """The settings with ``calibration_data`` fitted to this subgraph's inputs (None, so that
    it calibrates on its first calls, when the data does not fit)."""
    settings, inputs, index = job.settings, job.inputs, job.report.index
    if not settings.precision.calibrates or settings.calibration_data is None:
        return settings
    mismatch = calibration_mismatch(settings.calibration_data, inputs)
    if mismatch:  # e.g. a subgraph after a graph break: it sees other tensors
        logger.warning(
            "subgraph %d: calibration_data does not fit its inputs (%s); it calibrates on "
            "its first %d calls instead",
            index,
            mismatch,
            settings.calibration_steps,
        )
        return dataclasses.replace(settings, calibration_data=None)
    fitted = fit_batches_to_graph(frozen, settings.calibration_data, inputs)
    if fitted is None and not callable(settings.calibration_data):
        logger.warning(
            "subgraph %d: calibration_data has fewer samples than one batch of %d this "
            "graph was compiled for; it calibrates on its first %d calls instead",
            index,
            int(inputs[0].shape[0]),
            settings.calibration_steps,
        )
    if fitted is not None or not callable(settings.calibration_data):
        return dataclasses.replace(settings, calibration_data=fitted)
    return settings


def _lazy_int8(settings: Settings) -> bool:
    """INT8 without calibration data: it calibrates on the first real calls."""
    return _forced_int8(settings) and settings.calibration_data is None


def _transform(job: SubgraphJob, frozen: fx.GraphModule) -> PipelineResult | None:
    """The pipeline and the precision's form (``mixed``'s choice) on the frozen graph,
    measured on the subgraph's runtime; None (the reason in the report) when it fails and
    ``fallback`` is not ``raise``. The half form is chosen in :func:`_judged_runtime`, which
    keeps the runtime it built."""
    settings, backend = job.settings, job.backend
    try:
        result = transform_for(
            frozen,
            job.inputs,
            backend,
            settings,
            job.runtime_cls,
            job.axes,
            calibrate_later=_lazy_int8(settings),
            artifact_forms=False,
        )
    except (NotImplementedError, CalibrationDataError):
        raise  # bad calibration data is the user's to fix: never a silent float fallback
    except Exception as exc:
        if settings.fallback == "raise":
            raise RuntimeError(f"embedl_{backend.name}: transformation failed: {exc}") from exc
        job.report.reason = f"transformation failed: {error_line(exc)}"
        return None
    job.report.plan, job.report.pipeline = result.plan, result.report
    return result


def _build_stage(
    job: SubgraphJob, result: PipelineResult, alias_key: str | None
) -> Callable[..., Any] | None:
    """The runtime's infer for the pipeline's model (lazily, after calibration, for INT8
    without data, which then stores its warm-start alias), or None when the original graph
    runs."""
    if _lazy_int8(job.settings):
        job.report.calibrating = True
        job.report.reason = (
            f"{job.settings.precision} calibrates on the first {job.settings.calibration_steps} "
            "calls, which run in PyTorch; pass calibration_data to quantize when compiling"
        )

        def build(quantized: fx.GraphModule) -> Callable[..., Any] | None:
            job.report.reason = ""  # calibrated: what the build says from here on
            job.report.calibrating = False
            job.report.pipeline = dict(
                job.report.pipeline,
                precision=job.settings.precision.name,
                quantized=True,
                quantization=lazy.report,
            )
            infer = _build(job, result, quantized, float_model=result.model)
            remember_build(job, alias_key)  # the warm start's alias, once calibrated and built
            return infer

        lazy = calibrate_then_build(
            result.model, job.inputs, job.backend.quantizer, job.settings, build
        )
        return lazy
    if result.model is not result.float_model:
        infer = _build(job, result, result.model, float_model=result.float_model)
        runs_lower = infer is not None and job.report.runtime != "eager"
        if runs_lower and not job.report.lower_rejected:
            job.input_bounds = calibrated_input_bounds(result.model)
            if job.input_bounds:
                return watch_calibrated_ranges(infer, job.input_bounds, job.report.index)
        return infer
    return _build(job, result, result.model)


def _build(
    job: SubgraphJob,
    result: PipelineResult,
    model: fx.GraphModule,
    float_model: fx.GraphModule | None = None,
) -> Callable[..., Any] | None:
    """The runtime's infer, or None when it fails and the original graph runs instead.

    ``float_model`` marks ``model`` as lower precision (INT8, FP16, BF16): its artifact must
    pass :func:`~embedl_dynamo.tuning.judge.check_precision` against the float model, or the
    float artifact runs instead (never fake-quant).
    """
    try:
        runtime = _judged_runtime(job, result, model, float_model)
    except Exception as exc:
        if float_model is None or job.settings.fallback == "raise":
            return _runtime_failed(job, _label(job, model, float_model), exc)
        logger.warning(
            "subgraph %d: %s %s artifact rejected (%s); running the float artifact",
            job.report.index,
            job.settings.precision,
            _label(job, model, float_model),
            error_line(exc),
        )
        job.report.reason = f"{job.settings.precision} rejected, fp32 runs: {error_line(exc)}"
        job.report.pipeline = dict(job.report.pipeline, **{LOWER_REJECTED: True})
        try:
            runtime = _judged_runtime(job, result, float_model, None)
        except Exception as float_exc:
            return _runtime_failed(job, _label(job, float_model), float_exc)
    report = job.report
    if report.status == "eager":  # PyTorch beat the runtimes: the original graph runs
        runtime.deactivate()
        return None
    report.runtime = runtime.name
    report.cached = runtime.from_cache
    report.runtime_info = dict(runtime.build_info)
    if float_model is not None and _forced_int8(job.settings) and not report.lower_rejected:
        speed = compare_with_float(
            runtime, float_model, job.original, job.inputs, job.settings, job.axes, report.index
        )
        if speed is not None:  # INT8 runs as asked; a slower INT8 is said, not hidden
            report.pipeline = dict(report.pipeline, int8_speed=speed.to_dict())
    runtime.judge = None  # judged already; it holds the graphs it compared (their weights)
    return runtime.serve()  # INT8's guard on non-finite inputs: call_guards.guard_call


def _forced_int8(settings: Settings) -> bool:
    """INT8 on every layer the target quantizes (``int8``), not chosen per layer (``mixed``);
    not fp8 (it calibrates once, and is not timed on a CPU)."""
    return settings.precision.qdq_type == "int8" and not settings.precision.per_layer


def _label(
    job: SubgraphJob, model: fx.GraphModule, float_model: fx.GraphModule | None = None
) -> str:
    """The runtimes ``model`` may be built on, for messages (``onnxruntime/openvino``)."""
    options = run_options(model, float_model, job.runtime_cls, job.timed, job.settings.precision)
    return "/".join(dict.fromkeys(o.runtime.name for o in options))


def _judged_runtime(
    job: SubgraphJob,
    result: PipelineResult,
    model: fx.GraphModule,
    float_model: fx.GraphModule | None,
) -> Runtime:
    """``model`` built on the fastest of its runtimes, its artifact judged against the graph
    before any rewrite (:func:`~embedl_dynamo.tuning.judge.judge_against`: a float one on the
    build sample, a lower-precision one within ``accuracy_budget``). An artifact ``mixed`` held to the
    budget on this runtime in this compile (the report's ``judged``) is not judged again.
    Where eager beat the runtimes, the report says so (status ``eager``) and the runtime
    returned is PyTorch's, which the caller does not serve."""
    settings, report = job.settings, job.report
    judged = result.report.get("judged") if model is result.model else None
    options = run_options(model, float_model, job.runtime_cls, job.timed, settings.precision)
    # a float artifact against the graph Dynamo gave; a lower one must be finite, then reach
    # the budget against that graph below
    lower = (model,) if float_model is not None else ()
    judge = judge_against(job.original, job.inputs, lower)
    half = choose_half_form(
        model, float_model, job.runtime_cls, job.original, job.inputs, settings, job.axes
    )
    eager = job.original if times_eager(settings, job.on_cuda) else None  # it must beat eager
    if half is not None:  # bf16/fp16 on OpenVINO: the typed graph or the f32 graph + hint
        runtime = half.runtime
        report.reason = "; ".join(r for r in (report.reason, half.note) if r)
        report.pipeline = dict(report.pipeline, half_form=half.note)  # as export's report says
    elif len(options) > 1 or eager is not None:
        choice = fastest(options, job.inputs, settings, job.axes, judge, eager)
        runtime = choice.runtime
        report.reason = "; ".join(r for r in (report.reason, choice.note) if r)
        if choice.eager is not None:
            job.eager_won(choice.eager, choice.note)
            return runtime
        if choice.option.model is not model:  # the float graph beat the mixed one
            job.float_won(choice.note)
            float_model = None
    else:
        runtime = options[0].runtime(settings, job.axes).build(model, job.inputs, judge)
    _judge_on_sample(job, runtime, lower=float_model is not None, judged=judged)
    return runtime


def _judge_on_sample(
    job: SubgraphJob, runtime: Runtime, lower: bool, judged: dict[str, str] | None
) -> None:
    """Hold the artifact ``runtime`` runs to the graph Dynamo gave on the judging sample (the
    build sample and calibration batches: :func:`~embedl_dynamo.tuning.judge.judging_sample`):
    a ``lower`` one within ``accuracy_budget`` (unless ``mixed`` held this very artifact to it
    here: ``judged``), a float one by the float rule where the sample holds more than the build
    sample its runtime judged (an artifact right on the input its export traced alone is
    refused here, never served)."""
    settings = job.settings
    sample = judging_sample(job.inputs, settings.calibration_data)
    if lower:
        if not _judged_already(runtime, judged):
            check_precision(runtime, job.original, sample, settings.accuracy_budget)
    elif len(sample) > 1:  # the build sample counted again, so the batches keep their numbers
        check_float_sample(runtime, job.original, sample)


def _runtime_failed(job: SubgraphJob, label: str, exc: Exception) -> None:
    """Raise (``fallback="raise"``, or the eager runtime) or record that the original graph
    runs: no rewrite can break the fallback. ``label`` names the runtimes tried."""
    report = job.report
    if job.settings.fallback == "raise" or job.runtime_cls is EagerRuntime:
        raise RuntimeError(
            f"embedl_{job.backend.name}: the {label} runtime cannot take this "
            f"subgraph: {error_line(exc)}"
        ) from exc
    logger.debug("subgraph %d: runtime failure", report.index, exc_info=True)
    report.status, report.runtime = "eager", "eager"
    report.reason = f"{label} failed: {error_line(exc)}"
    job.failure = exc  # the caller narrows it to the ops that fail, or warns: warn_failed


def warn_failed(job: SubgraphJob) -> None:
    """Say, once, that the job's runtime failed (``job.failure``) and its graph runs in PyTorch:
    what the caller does when narrowing the failure to the ops that cause it found none."""
    report = job.report
    where = f"subgraph {report.index}" + (
        f" fragment {report.partition}" if report.partition is not None else ""
    )
    logger.warning("%s: %s; running it in PyTorch", where, report.reason)


def _finish(job: SubgraphJob, alias_key: str | None) -> None:
    """Record the report and, for a warm start next time, the artifact's alias (lazy INT8
    stores it once calibrated and built)."""
    report = job.report
    report.status = report.status or "compiled"
    report.compile_s = time.perf_counter() - job.start
    record(report)
    logger.info("%s", report)
    if not _lazy_int8(job.settings):
        remember_build(job, alias_key)


def _judged_already(runtime: Runtime, judged: dict[str, str] | None) -> bool:
    """Whether ``runtime`` runs the very artifact ``mixed`` held to the budget on this runtime
    in this compile (:attr:`~embedl_dynamo.tuning.mixed_precision.MixedChoice.judged`)."""
    return (
        judged is not None
        and judged["runtime"] == runtime.name
        and judged["artifact"] == runtime.key()
    )
