"""Refit: new weights into a compiled graph without building it again.

When the weights of a compiled graph change (``load_state_dict``, an optimizer step: the
guards of :mod:`~.frozen_weights` see it), the graph keeps its plan, its ONNX graph, its
runtime and, for INT8, its activation scales. What the weights decide is computed again, and
only that:

1. while the build ran the pipeline, :func:`~.refit_recipe.record_transform` recorded which
   tensor ops derive the transformed graph's constants from the frozen weights (folded
   BatchNorm, INT8 weight scales, half copies: a
   :class:`~embedl_dynamo.graph.weight_recipe.WeightRecipe`, kept with a warm start's alias);
2. :func:`refit_graph` freezes the new weights (no Dynamo trace: the graph is Dynamo's, kept),
   replays the recipe on them, and writes the constants into the built artifact's initializers
   (:func:`~embedl_dynamo.onnx.refit_weights.refit_initializers`: the int8 codes folded again
   from the new scales), stored in the artifact cache under a key of its own;
3. the same runtime class builds it with the same settings (its session options and threads),
   with no timing race and no INT8-versus-float speed comparison. A float artifact is judged
   against the new weights' graph as a build judges it; an INT8 one must stay within
   ``accuracy_budget`` of the float graph with the new weights on the calibration data, or it
   is calibrated again (a build of these weights on the runtime it ran on, still no Dynamo
   trace).

What cannot be refitted is built as before, with the reason in the report
(``pipeline["refit"]``): a weight of another shape or dtype, ``mixed`` precision (its layers'
precisions are timed), a constant the recipe cannot compute (SmoothQuant's, calibrated on
activations) or an initializer the exporter computed from a weight the new weights change
(:mod:`~embedl_dynamo.onnx.initializer_sources`: a rotary table from an unchanged ``inv_freq``
is kept). A partitioned graph, or one whose recipe cannot be replayed (the
pipeline read a weight's value), is built anew as before.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.digests import blake3_digest
from embedl_dynamo.cache.files import wait_for_cache_writes
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.dynamo.call_guards import guard_call, runs_int8
from embedl_dynamo.dynamo.compiled_call import watch_calibrated_ranges
from embedl_dynamo.dynamo.graph_build import build_graph, warn_failed
from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
from embedl_dynamo.errors import OutputMismatchError, error_line
from embedl_dynamo.graph.index_guards import guard_indices
from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.graph.weight_tensors import graph_weights
from embedl_dynamo.onnx.artifact import OnnxArtifact, cached_onnx, unstored_export
from embedl_dynamo.onnx.external_data import save_model_file
from embedl_dynamo.onnx.refit_weights import refit_initializers, replace_initializers
from embedl_dynamo.report.record import record
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import check_precision, judge_against, judging_sample

__all__ = ["RefitSource", "refit_artifact", "refit_graph", "refit_source", "refitting"]

logger = logging.getLogger(__name__)

_MODELS = ("model", "float_model")  # the recipe's namespaces, the one that runs tried first


@dataclasses.dataclass(frozen=True)
class RefitSource:
    """What a refit keeps of a build: its recipe, the artifact and runtime it ran on, the
    settings (calibration data fitted), the report (plan rows, pipeline, INT8 input bounds)."""

    recipe: WeightRecipe
    positions: Mapping[str, int]  # leaf name -> its position among Dynamo's arguments
    artifact_key: str
    runtime_cls: type[Runtime]
    settings: Settings
    report: SubgraphReport
    input_bounds: Mapping[int, float]


def refit_source(job: SubgraphJob, example_inputs: Sequence[Any]) -> RefitSource | None:
    """What a refit of ``job``'s build needs; None where it cannot be refitted (see the
    module). ``example_inputs`` are Dynamo's arguments of the build: each weight the recipe
    reads is found there by its memory, since a later freeze of the same graph names the
    weights otherwise (Dynamo drops the sources its names come from once it has compiled)."""
    recipe, report = job.weight_recipe, job.report
    runtime_cls = runtime_classes().get(report.runtime)
    key = report.runtime_info.get("key")
    if recipe is None or recipe.problem is not None or report.status != "compiled" or not key:
        return None
    if runtime_cls is None or runtime_cls.cpu_target is None or job.original is None:
        return None
    positions = _leaf_positions(graph_weights(job.original), recipe, example_inputs)
    if positions is None:
        return None
    return RefitSource(
        recipe, positions, key, runtime_cls, job.settings, report, dict(job.input_bounds)
    )


def _leaf_positions(
    weights: Mapping[str, torch.Tensor], recipe: WeightRecipe, args: Sequence[Any]
) -> dict[str, int] | None:
    """Each leaf's position among ``args``: the argument whose memory the frozen constant is."""
    where = {
        (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype): i
        for i, t in enumerate(args)
        if isinstance(t, torch.Tensor) and t.layout == torch.strided
    }
    positions = {}
    for name in recipe.leaves:
        t = weights.get(name)
        found = (
            None if t is None else where.get((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype))
        )
        if found is None:
            return None
        positions[name] = found
    return positions


def refitting(
    job: SubgraphJob, compile_graph: Callable[..., Any], example_inputs: Sequence[Any]
) -> Callable[..., Any]:
    """The rebuild a compiled call runs for new weights: ``compile_graph`` (the backend's
    compile of a Dynamo graph) refitting ``job``'s build where it can."""
    source = refit_source(job, example_inputs)
    if source is None:
        return compile_graph

    def recompile(gm: fx.GraphModule, args: Any, backend: Any, settings: Settings) -> Any:
        return compile_graph(gm, args, backend, settings, refit_from=source)

    return recompile


def refit_graph(
    source: RefitSource, job: SubgraphJob, graph: fx.GraphModule, args: Sequence[Any]
) -> Callable[..., Any] | None:
    """``graph`` (frozen from Dynamo's arguments ``args``, which hold the new weights) on
    ``source``'s runtime, its artifact refitted; a build where it cannot be (the report says
    why)."""
    job.settings, job.weight_recipe = source.settings, source.recipe
    original, axes = job.original, job.axes
    try:
        return _refit(source, job, graph, args)
    except _NotRefitted as exc:
        why, recalibrate = str(exc), exc.recalibrate
    except Exception as exc:  # a refit that fails is replaced by a build, which it only saves
        if job.settings.fallback == "raise":
            raise
        why, recalibrate = f"the refit failed: {error_line(exc)}", False
        logger.warning("subgraph %d: %s; building anew", job.report.index, why)
    logger.info("subgraph %d: new weights are built anew: %s", job.report.index, why)
    job.original, job.axes, job.weight_recipe = original, axes, None
    if recalibrate:  # INT8 with the kept scales misses the budget: on the same runtime
        job.runtime_cls, job.timed = source.runtime_cls, []
    infer = build_graph(job, graph)
    if job.failure is not None:
        warn_failed(job)
    job.report.pipeline = dict(job.report.pipeline, refit={"refitted": False, "reason": why})
    return infer


class _NotRefitted(Exception):
    def __init__(self, why: str, recalibrate: bool = False) -> None:
        super().__init__(why)
        self.recalibrate = recalibrate


def _refit(
    source: RefitSource, job: SubgraphJob, graph: fx.GraphModule, args: Sequence[Any]
) -> Callable[..., Any]:
    start = time.perf_counter()
    if source.settings.precision.per_layer:
        raise _NotRefitted(f"{source.settings.precision} times its layers' precisions anew")
    index_guard = guard_indices(graph)
    if index_guard is not None:  # as build_graph: the graph also flags an index out of range
        job.original = index_guard.graph
        job.axes = dataclasses.replace(job.axes, outputs=(*job.axes.outputs, {}))
    weights = {name: args[i] for name, i in source.positions.items() if i < len(args)}
    why = source.recipe.leaf_problem(weights)
    if why is not None:
        raise _NotRefitted(f"{why}: a weight's shape or dtype changed")
    replayed = source.recipe.replay(weights)
    artifact, model_name = refit_artifact(source, replayed)
    runtime = _built(source, job, artifact)
    report = job.report
    report.status, report.runtime, report.cached = "compiled", runtime.name, False
    report.runtime_info = dict(runtime.build_info)
    report.plan, report.reason = source.report.plan, source.report.reason
    refit: dict[str, Any] = {
        "refitted": True,
        "from": source.artifact_key[:16],
        "model": model_name,
    }
    report.pipeline = dict(source.report.pipeline)
    if _lower(source):  # INT8's activation scales kept, or a half precision: to the budget
        refit["cosine"] = round(_check_budget(source, job, runtime), 6)
        if source.settings.precision.calibrates:
            refit["scales"] = "kept: the refitted artifact is within accuracy_budget"
    report.pipeline["refit"] = {**refit, "refit_s": round(time.perf_counter() - start, 4)}
    report.compile_s = time.perf_counter() - job.start
    record(report)
    logger.info("%s", report)
    infer: Callable[..., Any] = runtime.serve()
    if runs_int8(job.settings, report) and source.input_bounds:
        job.input_bounds = dict(source.input_bounds)
        infer = watch_calibrated_ranges(infer, job.input_bounds, report.index)
    return guard_call(infer, job.original, report, job.settings, index_guard)


def _lower(source: RefitSource) -> bool:
    """Whether the refitted artifact runs a lower precision (held to the budget)."""
    return source.settings.precision.lower and not source.report.lower_rejected


def refit_artifact(
    source: RefitSource, replayed: dict[str, dict[str, torch.Tensor]]
) -> tuple[OnnxArtifact, str]:
    """The refitted ONNX artifact (written into the cache under a key of its own, or found
    there) and the transformed model it is of."""
    model = _built_model(source)
    name, values = _initializers(model, source.recipe, replayed)
    digests = {k: blake3_digest(v.tobytes()).hex() for k, v in sorted(values.items())}
    key = content_key("onnx-refit", source.artifact_key, digests)

    def write(tmp: Any) -> None:
        replace_initializers(model, values)
        save_model_file(model, tmp)

    meta = {"kind": "onnx", "refit_of": source.artifact_key}
    cache = ArtifactCache(source.settings.cache_dir, "onnx")
    written, built = cache.get_or_build(key, write, ".onnx", meta)  # read-only: a scratch copy
    return OnnxArtifact(key, built, written), name


def _built_model(source: RefitSource) -> Any:
    """The build's ONNX model: its cached file, or, where a weight changed in place while
    that was written (so it was not stored), the export kept in memory."""
    wait_for_cache_writes()  # the build's artifact may still be on its way to the disk
    found = cached_onnx(source.artifact_key, source.settings)
    if found is None:
        model = unstored_export(source.artifact_key)
        if model is None:
            raise _NotRefitted("the built artifact is no longer in the cache")
        return model
    path, checksum = found
    checksum()  # CorruptEntryError: the file is not what was built
    import onnx

    return onnx.load(str(path))


def _initializers(
    model: Any, recipe: WeightRecipe, replayed: dict[str, dict[str, torch.Tensor]]
) -> tuple[str, dict[str, Any]]:
    """The transformed model the artifact was exported from (the one that runs first) and
    the new values of the initializers its constants give."""
    reasons = []
    for name in _MODELS:
        independent, tainted = recipe.independent.get(name, {}), recipe.tainted(name)
        try:
            return name, refit_initializers(model, replayed[name], independent, tainted)
        except ValueError as exc:
            reasons.append(str(exc))
    raise _NotRefitted(reasons[0])


def _built(source: RefitSource, job: SubgraphJob, artifact: OnnxArtifact) -> Runtime:
    """The refitted artifact built on the runtime class the build ran on, judged: a float one
    against the graph of the new weights, a lower one for finite outputs (the budget below).
    One found in the cache has its checksum confirmed as it is read."""
    runtime = source.runtime_cls(job.settings, job.axes)
    if artifact.built:
        runtime.use_artifact(artifact)
    elif not runtime.use_cached(artifact.key):
        raise _NotRefitted("the refitted artifact could not be read back from the cache")
    lower = (job.original,) if _lower(source) else ()
    try:
        runtime.build(job.original, job.inputs, judge_against(job.original, job.inputs, lower))
    except OutputMismatchError as exc:
        raise _NotRefitted(f"the refitted artifact fails its check: {error_line(exc)}") from exc
    runtime.judge = None
    return runtime


def _check_budget(source: RefitSource, job: SubgraphJob, runtime: Runtime) -> float:
    """The worst cosine of the refitted lower-precision artifact to the float graph of the new
    weights on the judging sample (the calibration data); a miss calibrates again."""
    sample = judging_sample(job.inputs, job.settings.calibration_data)
    try:
        return check_precision(runtime, job.original, sample, job.settings.accuracy_budget)
    except OutputMismatchError as exc:
        runtime.deactivate()
        raise _NotRefitted(
            f"with the kept scales {error_line(exc, with_type=False)}; calibrated again",
            recalibrate=True,
        ) from exc
