"""A Dynamo subgraph partitioned by capability: each runtime fragment built, PyTorch between.

:func:`partition_for` decides, for the frozen graph of a job on a CPU runtime, whether one
runtime takes it whole (today's path, no partition) or which nodes go where
(:func:`~embedl_dynamo.partition.partition_graph`, the target's runtime first, then the other
CPU runtimes a float graph is timed on). :func:`build_partitioned` builds each fragment as a
subgraph of its own (:func:`~.graph_build.build_graph`: its pipeline, precision, warm start,
runtime and guards), on the inputs it receives when the graph runs, and calibration batches
fed through the whole partitioned graph; the result is the graph with each fragment one call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from embedl_dynamo.dynamo.graph_build import build_graph, warn_failed
from embedl_dynamo.dynamo.narrowing import failing_nodes
from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
from embedl_dynamo.errors import (
    CallRefused,
    OutputMismatchError,
    RuntimeUnavailableError,
    error_line,
)
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.partition import (
    Fragment,
    Partitioning,
    can_stitch,
    compute_nodes,
    fragment_inputs,
    is_compute_node,
    node_flops,
    partition_graph,
    stitch,
)
from embedl_dynamo.quant.int8.calibrate import as_batches, calibration_mismatch
from embedl_dynamo.report.record import record
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.conformance import CPU_RUNTIMES, kept_in_pytorch
from embedl_dynamo.runtimes.registry import AUTO, runtime_candidates
from embedl_dynamo.tuning.judge import FLOAT_RTOL, check_float, flat_outputs

__all__ = ["NARROWINGS", "build_narrowed", "build_partitioned", "partition_for"]

logger = logging.getLogger(__name__)


#: per runtime name, the nodes it failed on (held from it; another runtime may take them)
Held = dict[str, dict[fx.Node, str]]


def _conforming(job: SubgraphJob, graph: fx.GraphModule) -> list[type[Runtime]]:
    """The job's runtimes that take every node of ``graph``, the target's first."""
    classes = list(dict.fromkeys((job.runtime_cls, *job.timed)))
    return [c for c in classes if kept_in_pytorch(graph, [c.name]) is None]


def partition_for(job: SubgraphJob, graph: fx.GraphModule) -> Partitioning | None:
    """None where one runtime takes ``graph`` whole (``job`` then names it, and the runtimes
    timed are those that take it whole too), else the partition of ``graph``.

    Off the CPU runtimes the conformance table speaks for (TensorRT and Torch-TensorRT on a
    GPU, third-party runtimes), the graph is judged whole by its runtime's own checks."""
    if job.runtime_cls.name not in CPU_RUNTIMES:
        return None
    lower = job.settings.precision.lower
    fits = _conforming(job, graph)
    if job.runtime_cls in fits or (fits and not lower):
        job.timed = [c for c in job.timed if c in fits]
        job.timed = job.timed if len(job.timed) >= 2 else []
        if job.runtime_cls not in fits:
            job.runtime_cls = fits[0]
        return None
    return partition_graph(graph, _partition_runtimes(job), job.settings.min_subgraph_size)


def _partition_runtimes(job: SubgraphJob) -> list[str]:
    """The runtimes the job's fragments may use, the target's first (see
    :func:`_float_runtimes`)."""
    classes = [job.runtime_cls] if job.settings.precision.lower else _float_runtimes(job)
    return [c.name for c in classes if c.name in CPU_RUNTIMES]


def build_narrowed(job: SubgraphJob, graph: fx.GraphModule) -> Callable[..., Any] | None:
    """After the job's runtime failed on the whole ``graph`` (``job.failure``): the graph
    partitioned around the ops that fail on that runtime alone, built; None where narrowing
    finds none (:mod:`~.narrowing`), and the graph runs in PyTorch."""
    found = failing_nodes(graph, compute_nodes(graph), job.runtime_cls, job.settings, job.inputs)
    if found is None:
        return None
    held = {job.runtime_cls.name: found}
    partitioning = _partition_around(job, graph, held)
    if not partitioning.fragments:
        return None
    job.failure = None
    return build_partitioned(job, graph, partitioning, held, rounds=1)


def _float_runtimes(job: SubgraphJob) -> list[type[Runtime]]:
    """The runtimes a float graph's fragments may use, the target's first: the ones timed,
    and under ``runtime="auto"`` every other CPU runtime installed here, which may take what
    the first keeps (ONNX Runtime compares integers exactly where OpenVINO goes through
    float32). A lower precision stays on the runtime its route chose."""
    classes = [job.runtime_cls, *job.timed]
    if job.settings.runtime == AUTO:
        for name in CPU_RUNTIMES:
            try:
                classes.extend(runtime_candidates(name, None, job.on_cuda))
            except RuntimeUnavailableError:
                continue  # not installed here
    return list(dict.fromkeys(classes))


def build_partitioned(
    job: SubgraphJob,
    graph: fx.GraphModule,
    partitioning: Partitioning,
    held: Held | None = None,
    rounds: int = 0,
) -> Callable[..., Any]:
    """The partitioned graph, each fragment built on its runtime (or left in PyTorch where its
    build says so), recorded in ``job.report`` with what stays in PyTorch and why. A fragment
    whose runtime fails on it is narrowed to the ops that fail (:mod:`~.narrowing`), and the
    graph is partitioned again around them and ``held``'s nodes (``rounds``: how many times
    it was already), up to :data:`NARROWINGS` times. ``held``: per runtime, the nodes it
    failed on, which another runtime may take."""
    fragments = partitioning.fragments
    classes = {c.name: c for c in _float_runtimes(job)}
    examples = fragment_inputs(graph, fragments, [job.inputs])
    calibration = _fragment_calibration(job, graph, fragments)
    calls: list[Callable[..., Any]] = []
    failed: list[tuple[Fragment, SubgraphJob]] = []
    for k, fragment in enumerate(fragments):
        child = _child_job(job, graph, fragment, k, classes)
        child.inputs = list(examples[k][0])
        if calibration is not None:
            child.settings = dataclasses.replace(child.settings, calibration_data=calibration[k])
        with torch._guards.tracing(None):  # see _build_outside_dynamo
            infer = build_graph(child, fragment.graph)
        calls.append(infer if infer is not None else fragment.graph)
        job.report.partitions.append(child.report)
        if child.failure is not None:
            failed.append((fragment, child))
    narrowed = _narrowed(job, graph, failed, held or {}) if rounds < NARROWINGS else None
    if narrowed is not None:
        job.report.partitions = []
        if not narrowed[0].fragments:  # every op held or kept: the graph runs in PyTorch
            return _all_kept(job, graph, narrowed[0])
        return build_partitioned(job, graph, *narrowed, rounds=rounds + 1)
    for _, child in failed:
        warn_failed(child)
    stitched = stitch(graph, fragments, calls)
    mismatch = _stitched_mismatch(job, graph, stitched)
    if mismatch is not None:
        if job.settings.fallback == "raise":
            raise OutputMismatchError(mismatch)
        warnings.warn(f"embedl_{job.backend.name}: {mismatch}", RuntimeWarning, stacklevel=3)
        job.stay_eager("eager", mismatch, graph)
        return None
    _finish_partitioned(job, graph, partitioning)

    def run(*inputs: Any) -> tuple[Any, ...]:
        out = stitched(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return run


#: how many times one graph is partitioned again around the ops its runtimes failed on
NARROWINGS = 2


def _narrowed(
    job: SubgraphJob,
    graph: fx.GraphModule,
    failed: list[tuple[Fragment, SubgraphJob]],
    held: Held,
) -> tuple[Partitioning, Held] | None:
    """The graph partitioned again around ``held`` and the ops each failed fragment's runtime
    fails on alone, or the whole fragment where none fails alone (held from that runtime
    only: another may take them), with the nodes held; None where no fragment failed."""
    if not failed:
        return None
    held = {runtime: dict(nodes) for runtime, nodes in held.items()}
    for fragment, child in failed:
        nodes = [n for n in fragment.nodes if is_compute_node(n)]
        failing = failing_nodes(graph, nodes, child.runtime_cls, job.settings, job.inputs)
        if failing is None:  # nothing narrower fails: the fragment, held from its runtime
            why = f"{child.runtime_cls.name} failed on it: {error_line(child.failure)}"
            failing = dict.fromkeys(nodes, why)
        held.setdefault(child.runtime_cls.name, {}).update(failing)
    return _partition_around(job, graph, held), held


def _all_kept(job: SubgraphJob, graph: fx.GraphModule, partitioning: Partitioning) -> None:
    """The graph in PyTorch, as a partition without fragments leaves it, said once with the
    first reason (as a failure that narrowing found no narrower part of is)."""
    kept = partitioning.blocker or partitioning.kept[0]
    job.stay_eager("eager", kept.reason, graph)
    warn_failed(job)


def _partition_around(job: SubgraphJob, graph: fx.GraphModule, held: Held) -> Partitioning:
    """The graph partitioned with each runtime's failures held from it, so that another
    runtime may take them; where that cannot be stitched (in-place writes order two fragments
    both ways), with every failure held from every runtime, so that they run in PyTorch."""
    runtimes, min_ops = _partition_runtimes(job), job.settings.min_subgraph_size
    partitioning = partition_graph(graph, runtimes, min_ops, held=held)
    if can_stitch(graph, partitioning.fragments):
        return partitioning
    everywhere = {node: why for nodes in held.values() for node, why in nodes.items()}
    return partition_graph(graph, runtimes, min_ops, held=dict.fromkeys(runtimes, everywhere))


#: the partitioned graph's bound against PyTorch's on its first inputs, relative to each
#: output's scale: each fragment holds FLOAT_RTOL; this checks how they are put together
STITCHED_RTOL = 10 * FLOAT_RTOL


def _stitched_mismatch(
    job: SubgraphJob, graph: fx.GraphModule, stitched: fx.GraphModule
) -> str | None:
    """Why the partitioned float graph does not give PyTorch's outputs on the job's inputs, or
    None. Each fragment is judged against its own part of the graph; this catches what only
    the whole shows, such as PyTorch's parts run in another order than the graph's. A lower
    precision is judged by its own budget instead."""
    if job.settings.precision.lower:
        return None
    with torch.no_grad():
        expected = flat_outputs(graph(*job.inputs))
        try:
            actual = flat_outputs(stitched(*job.inputs))
        except CallRefused:  # a fragment's guard sends these inputs to PyTorch: no evidence
            return None
    try:
        check_float(expected, actual, f"subgraph {job.report.index} partitioned", STITCHED_RTOL)
    except OutputMismatchError as error:
        return f"{error}; it runs in PyTorch"
    return None


# _build_outside_dynamo: a fragment is built outside Dynamo's tracing context. Its inputs are
# tensors the graph computes, which Dynamo's fake mode has never seen: a pass that detects the
# context's fake mode (torch.fx's ShapeProp) would make them fake with new symbols, and guards
# on those fail Dynamo's guard building (they have no source). Outside the context such a pass
# runs on the real example inputs; sizes Dynamo made symbolic keep their fake tensors.


def _fragment_calibration(
    job: SubgraphJob, graph: fx.GraphModule, fragments: list[Fragment]
) -> list[list[tuple[Any, ...]] | None] | None:
    """Each fragment's calibration batches: what it receives when the graph runs in PyTorch on
    the calibration data (None: nothing to feed, or a forward loop; a fragment then calibrates
    on its first calls)."""
    settings = job.settings
    data = settings.calibration_data
    if not settings.precision.calibrates or data is None or callable(data):
        return None
    if calibration_mismatch(data, job.inputs):
        return None
    return fragment_inputs(graph, fragments, as_batches(data))


def _child_job(
    job: SubgraphJob,
    graph: fx.GraphModule,
    fragment: Fragment,
    k: int,
    classes: dict[str, type[Runtime]],
) -> SubgraphJob:
    """The job that builds fragment ``k``: the parent's target and settings, its runtime, the
    parent's timed runtimes that take the whole fragment, its own report."""
    runtime_cls = classes[fragment.runtime]
    timed = [c for c in job.timed if kept_in_pytorch(fragment.graph, [c.name]) is None]
    report = SubgraphReport(
        index=job.report.index,
        backend=job.backend.name,
        runtime="eager",
        ops=fragment.ops,
        status="",
        partition=k,
    )
    return SubgraphJob(
        job.backend,
        job.settings,
        report,
        runtime_cls,
        timed if len(timed) >= 2 else [],
        time.perf_counter(),
        axes=_fragment_axes(job, graph, fragment),
        original=fragment.graph,
        on_cuda=job.on_cuda,
    )


def _fragment_axes(job: SubgraphJob, graph: fx.GraphModule, fragment: Fragment) -> DynamicAxes:
    """A fragment's dynamic axes: a graph input's as the graph has them; other tensors' where
    Dynamo made their size symbolic, one name per symbol (the graph inputs' names first)."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    given = dict(zip(placeholders, job.axes.inputs)) if job.axes is not None else {}
    names: dict[str, str] = {}
    for node, axes in given.items():
        shape = getattr(node_value_meta(node), "shape", ())
        for axis, name in axes.items():
            if axis < len(shape) and _symbolic(shape[axis]):
                names[str(shape[axis])] = name

    def axes_of(node: fx.Node) -> dict[int, str]:
        if node in given:
            return dict(given[node])
        shape = getattr(node_value_meta(node), "shape", ())
        return {
            axis: names.setdefault(str(size), f"{node.name}_dim{axis}")
            for axis, size in enumerate(shape)
            if _symbolic(size)
        }

    static = job.axes.static_graph if job.axes is not None else True
    return DynamicAxes(
        tuple(axes_of(n) for n in fragment.inputs),
        tuple(axes_of(n) for n in fragment.outputs),
        static_graph=static,
    )


def _symbolic(size: Any) -> bool:
    return not isinstance(size, int) and not is_concrete_int(size)


def _coverage(
    job: SubgraphJob, graph: fx.GraphModule, partitioning: Partitioning
) -> dict[str, Any]:
    """The share of compute nodes and FLOPs that run on a runtime (fragments a build left in
    PyTorch count as PyTorch's)."""
    parts = job.report.partitions
    built = [f for f, p in zip(partitioning.fragments, parts) if p.runtime != "eager"]
    on_runtime = sum(f.ops for f in built)
    flops = node_flops(graph, job.inputs, compute_nodes(graph))
    total = sum(flops.values())
    placed = sum(flops.get(n, 0) for f in built for n in f.nodes)
    return {
        "ops": partitioning.ops,
        "ops_on_runtime": on_runtime,
        "op_share": round(on_runtime / partitioning.ops, 4) if partitioning.ops else 1.0,
        "flops": total,
        "flops_on_runtime": placed,
        "flop_share": round(placed / total, 4) if total else 1.0,
    }


def _finish_partitioned(
    job: SubgraphJob, graph: fx.GraphModule, partitioning: Partitioning
) -> None:
    """Record the partitioned subgraph: its fragments, what stays in PyTorch and why, its
    coverage; one warning names the ops kept."""
    report, parts = job.report, job.report.partitions
    runtimes = sorted({p.runtime for p in parts if p.runtime != "eager"})
    report.status = "partitioned"
    report.pipeline = {"applied_count": sum(p.pipeline.get("applied_count", 0) for p in parts)}
    report.runtime = "+".join(runtimes) or "eager"
    report.kept = [dataclasses.asdict(k) for k in partitioning.kept]
    report.coverage = _coverage(job, graph, partitioning)
    report.reason = _kept_reason(partitioning)
    report.compile_s = time.perf_counter() - job.start
    record(report)
    logger.info("%s", report)
    if partitioning.kept:  # fragments on several runtimes, nothing kept: nothing to warn
        warnings.warn(
            f"embedl_{job.backend.name}: subgraph {report.index} runs on {report.runtime}, "
            f"except {report.reason}",
            RuntimeWarning,
            stacklevel=4,
        )


def _kept_reason(partitioning: Partitioning) -> str:
    """What stays in PyTorch and why (its first three reasons), or where the fragments run."""
    if not partitioning.kept:
        runtimes = " and ".join(sorted({f.runtime for f in partitioning.fragments}))
        return f"all {partitioning.ops} ops run on runtimes, split over {runtimes}"
    reasons = list(dict.fromkeys(k.reason for k in partitioning.kept))
    return (
        f"{len(partitioning.kept)} of {partitioning.ops} ops stay in PyTorch: "
        + "; ".join(reasons[:3])
        + ("; ..." if len(reasons) > 3 else "")
    )
