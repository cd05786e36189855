"""A warm start: a subgraph compiled before loads its artifact without running the pipeline.

Every precision takes it. A subgraph is keyed *before* transformation (:func:`source_key`: its
graph, weights, inputs, the target's patterns, the settings, the calibration data and this
package's code); after its first compile an alias maps that key to the ONNX artifact, the
runtime it ran on and what the build decided and measured (plan rows, per-layer precisions,
the INT8 ranges its inputs were calibrated to, the CPU and library versions it was decided
with). The next compile of the same subgraph, in any process and on any machine that has the
cache, loads that artifact (:func:`warm_start`) and runs no pipeline stage: no calibration, no
per-layer race, no export and no timing. A decision made on another CPU or with other runtime
versions is used as built, and the report says where it was made (``decided on <cpu>``).

A float artifact is checked against the frozen graph on the example inputs, as at its build; a
lower-precision one was held to ``accuracy_budget`` when it was built (the report keeps that
verdict) and is checked to give finite outputs here, where its inputs are finite. A loaded INT8
artifact refuses calls with NaN or infinity as a built one does
(:func:`~embedl_dynamo.dynamo.call_guards.guard_call`). A graph compiled under
``torch.autocast`` or another default dtype has a key of its own, so it never replaces the
artifact of the same graph compiled without. A subgraph that eager beat the runtimes on
(:mod:`embedl_dynamo.tuning.beat_eager`) has an alias that says so, with both times: its warm
start runs the original graph in PyTorch, builds nothing and times nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.cache.keys import (
    content_key,
    cpu_name,
    fingerprint_graph,
    jsonable,
    library_versions,
)
from embedl_dynamo.dynamo.compiled_call import watch_calibrated_ranges
from embedl_dynamo.dynamo.subgraph_alias import forget_alias, lookup_alias, store_alias
from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
from embedl_dynamo.errors import CorruptEntryError, OutputMismatchError, error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.onnx.artifact import input_specs
from embedl_dynamo.quant.int8.calibrate import data_fingerprint
from embedl_dynamo.report.plan_rows import PlanSnapshot
from embedl_dynamo.report.record import record
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.beat_eager import EagerSpeed, warn_eager_faster
from embedl_dynamo.tuning.int8_speed import Int8Speed, warn_if_slower
from embedl_dynamo.tuning.judge import check_finite, judge_artifact

__all__ = [
    "WarmStart",
    "alias_key_of",
    "calibration_identity",
    "decided_here",
    "remember_build",
    "source_key",
    "start_warm",
    "warm_start",
]

logger = logging.getLogger(__name__)


def calibration_identity(settings: Settings, frozen: fx.GraphModule) -> str | None:
    """What the subgraph is calibrated on, as a key part: ``"none"`` for a precision that does
    not calibrate, ``"first-calls"`` for INT8 that calibrates on its first real calls (the
    warm start then reuses the ranges of the process that built it), else the fingerprint of
    ``calibration_data`` (a ``forward_loop`` by what it feeds ``frozen``; a saved compiled
    function's stand-in by the ``saved_identity`` it holds). None: the data cannot be
    fingerprinted, so the subgraph has no warm start."""
    if not settings.precision.calibrates:
        return "none"
    data = settings.calibration_data
    if data is None:
        return "first-calls"
    saved = getattr(data, "saved_identity", None)  # a saved compiled function's (by identity)
    if isinstance(saved, str):
        return saved
    return data_fingerprint(data, model=frozen)


def source_key(
    frozen: fx.GraphModule,
    inputs: list[torch.Tensor],
    axes: DynamicAxes,
    backend: Backend,
    settings: Settings,
    calibration: str = "none",
) -> str:
    """Key of a subgraph *before* transformation: graph, weights, the autocast state and
    default dtype it is compiled under (:func:`~embedl_dynamo.cache.keys.fingerprint_graph`),
    inputs, patterns, settings, calibration data and code. Not the CPU or the runtimes'
    versions: a cache built on one machine starts the same model on another (the alias
    records where it was decided)."""
    return content_key(
        "subgraph",
        fingerprint_graph(frozen),
        input_specs(inputs, axes),
        axes.to_json(),
        backend.to_dict(),
        settings.key_dict(),
        {"calibration": calibration},
        library_versions(),
    )


def decided_here(runtime: type[Runtime]) -> dict[str, Any]:
    """Where a build's decisions were made: this CPU and the runtime's library versions."""
    return {"cpu": cpu_name(), "versions": library_versions([runtime])}


class WarmStart:
    """What :func:`warm_start` loaded: the callable, and the INT8 input bounds to watch.

    Attributes:
        infer: the runtime's served callable; None where eager beat the runtimes (the
            original graph runs).
        input_bounds: graph input position -> the largest magnitude calibration saw there.
        weight_recipe: the build's weight recipe, for a refit (:mod:`~.refit`), or None.
    """

    def __init__(
        self,
        infer: Callable[..., Any] | None,
        input_bounds: dict[int, float],
        weight_recipe: WeightRecipe | None = None,
    ) -> None:
        self.infer = infer
        self.input_bounds = input_bounds
        self.weight_recipe = weight_recipe


def warm_start(
    source_key: str,
    frozen: fx.GraphModule,
    inputs: list[torch.Tensor],
    axes: DynamicAxes,
    settings: Settings,
    report: SubgraphReport,
    runtimes: Sequence[type[Runtime]],
) -> WarmStart | None:
    """With a warm cache, load the artifact this subgraph compiled to before, skipping the
    pipeline, on the runtime it ran on (one of ``runtimes``); the report gets the plan rows and
    pipeline summary the alias stored (no graph is kept for it) and ``loaded``.

    Returns None when there is nothing usable in the cache.
    """
    try:
        alias = lookup_alias(source_key, settings)
    except (OSError, ValueError) as exc:  # an unreadable cache must not stop the compile
        logger.warning("subgraph %d: warm cache unusable (%s); compiling", report.index, exc)
        return None
    if alias is None:
        return None
    if alias.get("runtime") == EagerRuntime.name:  # eager beat the runtimes: nothing to build
        try:
            EagerSpeed.from_dict((alias.get("pipeline") or {})["eager_speed"])
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning(
                "subgraph %d: eager decision unusable (%s); compiling",
                report.index,
                error_line(exc),
            )
            return None
        report.status, report.runtime = "eager", EagerRuntime.name
        _fill_report(report, alias, runtimes[0])
        return WarmStart(None, {})
    by_name = {cls.name: cls for cls in runtimes}
    runtime_cls = by_name.get(str(alias.get("runtime", OnnxRuntime.name)))
    if runtime_cls is None or not runtime_cls.is_available():
        return None  # it ran on a runtime not wanted, or not installed, here
    runtime = runtime_cls(settings, axes)
    if not runtime.use_cached(alias["onnx_key"]):
        return None
    try:
        runtime.build(
            frozen, inputs, _judge_loaded(inputs) if settings.precision.lower else judge_artifact
        )
    except Exception as exc:
        # wrong answers are the entry's fault: said. A run that fails (a division by zero in
        # these inputs) fails the compile that follows too, which says it in its one line
        bad = isinstance(exc, (OutputMismatchError, CorruptEntryError))
        level = logging.WARNING if bad else logging.INFO
        logger.log(
            level,
            "cached artifact for subgraph %d unusable (%s); replacing it",
            report.index,
            error_line(exc),
        )
        forget_alias(source_key, alias["onnx_key"], settings)
        return None
    report.runtime, report.cached = runtime.name, True
    report.runtime_info = dict(runtime.build_info)
    _fill_report(report, alias, runtime_cls)
    bounds = {int(k): float(v) for k, v in (alias.get("input_bounds") or {}).items()}
    return WarmStart(runtime.serve(), bounds, _recipe(alias.get("weight_recipe")))


def _recipe(data: Any) -> WeightRecipe | None:
    """The weight recipe an alias stored (None: none, or one this code cannot read)."""
    try:
        return WeightRecipe.from_dict(data) if data is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def _fill_report(report: SubgraphReport, alias: dict[str, Any], runtime_cls: type[Runtime]) -> None:
    """The report of a warm start from what the alias stored (no graph is kept for it)."""
    report.pipeline = dict(alias.get("pipeline") or {})
    report.plan = PlanSnapshot.from_dicts(alias.get("plan") or [])  # rows, never the graph
    report.reason = str(alias.get("reason") or report.reason)
    report.loaded = _where_decided(alias.get("decided"), runtime_cls)


def _judge_loaded(inputs: Sequence[torch.Tensor]) -> Callable[..., None]:
    """The judge of a loaded lower-precision artifact: held to the budget when it was built,
    here its outputs must be finite (a NaN means the file is not what was judged). On inputs
    that hold NaN or infinity (a first call with a NaN) its outputs tell nothing about the
    file, and a good entry must not be forgotten for them: nothing is checked (the file's
    checksum still is; such calls to an INT8 artifact run in PyTorch, :func:`start_warm`)."""
    finite = all(not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in inputs)

    def judge(
        gm: fx.GraphModule,
        reference: Callable[[], Sequence[torch.Tensor]],
        actual: Sequence[torch.Tensor],
        what: str,
        rtol: float,
    ) -> None:
        if finite:
            check_finite(actual, f"loaded {what}")

    return judge


def _where_decided(decided: Any, runtime_cls: type[Runtime]) -> str:
    """``"here"``, or where the loaded build's decisions were made when that differs."""
    if not isinstance(decided, dict):
        return "loaded (decided where the cache was built)"
    here = decided_here(runtime_cls)
    parts = []
    if decided.get("cpu") != here["cpu"]:
        parts.append(f"on {decided.get('cpu')}")
    theirs = decided.get("versions") or {}
    changed = sorted(k for k, v in here["versions"].items() if k in theirs and theirs[k] != v)
    if changed:
        parts.append("with " + ", ".join(f"{k} {theirs[k]}" for k in changed))
    return "loaded" if not parts else "loaded (decided " + " ".join(parts) + ")"


def remember_build(job: SubgraphJob, alias_key: str | None) -> None:
    """Store the alias a warm start loads: the artifact (none where eager beat the runtimes),
    its runtime, the report's plan rows, pipeline summary and reason, the INT8 input bounds,
    and where it was decided."""
    report = job.report
    built = report.status == "compiled" and report.runtime_info.get("key")
    eager = report.status == "eager" and "eager_speed" in report.pipeline
    # an eager decision: where the warm start reads it (start_warm's first runtime)
    runtime_cls = (
        (job.timed or [job.runtime_cls])[0] if eager else runtime_classes().get(report.runtime)
    )
    if alias_key is None or not (built or eager) or runtime_cls is None:
        return
    alias = {"runtime": report.runtime}
    if built:
        alias["onnx_key"] = report.runtime_info["key"]
    alias["plan"] = report.plan.summary()["matches"] if report.plan is not None else []
    alias["pipeline"] = _storable(report.pipeline)
    alias["reason"] = report.reason
    alias["input_bounds"] = {str(k): v for k, v in job.input_bounds.items()}
    alias["decided"] = decided_here(runtime_cls)
    recipe = job.weight_recipe  # a warm start refits new weights as the build would
    alias["weight_recipe"] = recipe.to_dict() if recipe and recipe.problem is None else None
    store_alias(alias_key, alias, job.settings)


def _storable(pipeline: dict[str, Any]) -> dict[str, Any]:
    """The pipeline report's entries that are plain JSON (what a warm start's report shows)."""
    kept = {}
    for name, value in pipeline.items():
        try:
            kept[name] = jsonable(value)
        except TypeError:
            continue
    return kept


def alias_key_of(job: SubgraphJob, frozen: fx.GraphModule) -> str | None:
    """The subgraph's key before any rewrite, under which a warm start finds what it compiled
    to (None: no warm start, for a runtime that keeps no ONNX artifact, or calibration data
    that cannot be fingerprinted)."""
    if job.runtime_cls.cpu_target is None:
        return None
    calibration = calibration_identity(job.settings, frozen)
    if calibration is None:
        logger.info(
            "subgraph %d: no warm start (calibration_data cannot be fingerprinted)",
            job.report.index,
        )
        return None
    return source_key(frozen, job.inputs, job.axes, job.backend, job.settings, calibration)


def start_warm(job: SubgraphJob, frozen: fx.GraphModule, alias_key: str) -> WarmStart | None:
    """What the warm cache holds for the subgraph (the report recorded): the runtime's infer,
    or None as it where eager beat the runtimes; None when nothing usable is cached."""
    runtimes = job.timed or [job.runtime_cls]
    report = job.report
    loaded = warm_start(alias_key, frozen, job.inputs, job.axes, job.settings, report, runtimes)
    if loaded is None:
        return None
    report.status = report.status or "compiled"
    report.compile_s = time.perf_counter() - job.start
    record(report)
    logger.info("%s", report)
    speed = report.pipeline.get("int8_speed")
    if isinstance(speed, dict):  # a slower INT8 is said on every start, as at its build
        warn_if_slower(Int8Speed.from_dict(speed), report.index)
    if loaded.infer is None:  # eager beat the runtimes: said on every start, as at its decision
        warn_eager_faster(EagerSpeed.from_dict(report.pipeline["eager_speed"]), report.index)
    if loaded.infer is not None and loaded.input_bounds:
        loaded.infer = watch_calibrated_ranges(loaded.infer, loaded.input_bounds, report.index)
    job.weight_recipe = loaded.weight_recipe
    return loaded
