"""Compile one Dynamo subgraph: freeze, partition by capability, build each part, fall back.

Per subgraph Dynamo hands over (the runtime is routed first,
:func:`~embedl_dynamo.dynamo.subgraph_job.route_subgraph`):

0. where no runtime of the target runs (none installed, or none that takes a graph on a CUDA
   device), Dynamo's own graph runs, with one warning a process: eager's numbers to the bit;
1. a training graph or inputs that require grad run eagerly, with one warning;
2. subgraphs with fewer than ``min_subgraph_size`` ops stay in PyTorch;
3. :func:`~embedl_dynamo.graph.freeze.freeze` makes the graph functional with its weights as
   constants, then it is partitioned by capability (:mod:`embedl_dynamo.partition`): the ops a
   CPU runtime computes as PyTorch does (:mod:`embedl_dynamo.runtimes.conformance`) go to it,
   the others stay in PyTorch in the same graph, with one warning naming them;
4. the whole graph, or each runtime fragment, is built (:func:`~.graph_build.build_graph`:
   warm start, pipeline, runtime, judge, per-call guards); what fails runs in PyTorch
   (``fallback="eager"``) or raises (``fallback="raise"``).

The TensorRT path on a GPU (no conformance table speaks for it) is judged per whole graph, by
its own lint and the first-call check.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import optimization_hint

from embedl_dynamo.backend import Backend
from embedl_dynamo.dynamo.compiled_call import wrap_compiled
from embedl_dynamo.dynamo.graph_build import build_graph, warn_failed
from embedl_dynamo.dynamo.partitioned import build_narrowed, build_partitioned, partition_for
from embedl_dynamo.dynamo.refit import RefitSource, refit_graph, refitting
from embedl_dynamo.dynamo.subgraph_job import SubgraphJob, route_subgraph
from embedl_dynamo.graph.analysis import GraphAnalysis, analyze
from embedl_dynamo.graph.dynamic_axes import DynamicAxes, dynamic_axes
from embedl_dynamo.graph.freeze import FrozenGraph, freeze, inference_blocker
from embedl_dynamo.graph.output_views import ViewBases, with_view_bases
from embedl_dynamo.graph.scalar_outputs import SplitOutputs, split_scalar_outputs
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.registry import AUTO
from embedl_dynamo.settings import Settings

__all__ = ["Prepared", "StaysEager", "compile_subgraph", "prepare_subgraph"]


def compile_subgraph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend,
    settings: Settings,
    refit_from: RefitSource | None = None,
) -> Callable[..., Any]:
    """Compile one Dynamo graph for ``backend``; the returned callable takes Dynamo's arguments.

    Args:
        gm: the graph Dynamo gave (parameters lifted as inputs); not modified.
        example_inputs: the real inputs Dynamo gave with it.
        backend: the target.
        settings: the settings.
        refit_from: the build of this graph for other weights, refitted with these
            (:mod:`~embedl_dynamo.dynamo.refit`) instead of a new build where it can be.

    Returns:
        A callable taking the same arguments as ``gm``.
    """
    job = route_subgraph(gm, example_inputs, backend, settings)
    analysis = analyze(gm)  # once: every decision below reads this record of Dynamo's graph
    prepared = prepare_subgraph(job, gm, example_inputs, analysis)
    if isinstance(prepared, StaysEager):
        return job.stay_eager(prepared.status, prepared.reason, gm.forward)
    frozen, split, graph = prepared.frozen, prepared.split, prepared.split.tensors
    gm, analysis = prepared.gm, prepared.analysis  # Dynamo's, or it returning view bases too
    partitioning = partition_for(job, graph)
    if partitioning is None and refit_from is not None:  # new weights: refitted
        infer = refit_graph(refit_from, job, graph, example_inputs)
    elif partitioning is None:  # one runtime takes the whole graph
        reference, axes = job.original, job.axes  # build_graph's index guard extends them
        infer = build_graph(job, graph)
        if infer is None and job.failure is not None:  # unless it fails: narrowed to the ops
            job.original, job.axes = reference, axes
            infer = build_narrowed(job, graph)
            if infer is None and job.failure is not None:  # else the partition said why
                warn_failed(job)
    elif not partitioning.fragments:
        kept = partitioning.blocker or partitioning.kept[0]
        warnings.warn(f"embedl_{job.backend.name}: {kept.reason}", RuntimeWarning, stacklevel=2)
        return job.stay_eager("eager", kept.reason, gm.forward)
    else:
        infer = build_partitioned(job, graph, partitioning)
    compiled = wrap_compiled(
        gm,
        infer,
        frozen.user_inputs,
        job.report,
        job.settings,
        job.backend,
        example_inputs,
        refitting(job, compile_subgraph, example_inputs),  # new weights: a refit where it can be
        split.scalars,
        _int_positions(frozen),
        frozen.specialized,
        frozen.written,
        frozen.returned,
        frozen.views,
        analysis,
    )
    return prepared.visible(compiled)


@dataclasses.dataclass(frozen=True)
class StaysEager:
    """Why a Dynamo graph runs as it is: its report status (``eager``, or ``training`` for a
    graph that trains) and the reason."""

    status: str
    reason: str


@dataclasses.dataclass
class Prepared:
    """A Dynamo graph frozen and split for the runtimes (``job`` holds its inputs and axes).

    ``gm`` is the graph compiled, with ``analysis`` its record: Dynamo's, or its copy that also
    returns the tensors several outputs view (:func:`with_view_bases`: ``bases``, None where
    it is Dynamo's own)."""

    frozen: FrozenGraph
    split: SplitOutputs
    gm: fx.GraphModule
    analysis: GraphAnalysis
    bases: ViewBases | None = None

    def visible(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled`` (which runs :attr:`gm`) returning Dynamo's outputs only."""
        bases = self.bases
        if bases is None:
            return compiled

        def dynamo_outputs(*args: Any) -> Any:
            return bases.visible(compiled(*args))

        report = getattr(compiled, "embedl_report", None)  # none where it runs in PyTorch
        if report is not None:
            dynamo_outputs.embedl_report = report  # type: ignore[attr-defined]
        return dynamo_outputs


def prepare_subgraph(
    job: SubgraphJob,
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    analysis: GraphAnalysis | None = None,
) -> Prepared | StaysEager:
    """Freeze ``gm`` and split its number outputs off, filling ``job``'s inputs, reference
    graph and axes; or why it runs as it is. ``analysis`` is ``gm``'s
    (:mod:`embedl_dynamo.graph.analysis`), where the caller has it."""
    analysis = analysis if analysis is not None else analyze(gm)
    bases = with_view_bases(gm, analysis)  # outputs that view one tensor the graph keeps
    if bases is not None:
        gm, analysis = bases.gm, analyze(bases.gm)
    reason = _eager_reason(job, gm, example_inputs, analysis)
    if reason is not None:
        return reason
    frozen = freeze(gm, example_inputs, write_back=True, analysis=analysis)
    job.inputs = _user_inputs(frozen, example_inputs)
    if any(not isinstance(t, torch.Tensor) for t in job.inputs):
        return StaysEager("eager", "the graph takes non-tensor inputs that are not batch sizes")
    split = split_scalar_outputs(frozen.gm)  # sizes among the outputs are computed in PyTorch
    if split.blocker is not None:
        return StaysEager("eager", split.blocker)
    job.original = split.tensors
    job.axes = _axes(gm, frozen, split, job)
    return Prepared(frozen, split, gm, analysis, bases)


def _eager_reason(
    job: SubgraphJob, gm: fx.GraphModule, example_inputs: Sequence[Any], analysis: GraphAnalysis
) -> StaysEager | None:
    """Why the Dynamo graph runs as it is, before anything is frozen (None: it is compiled);
    a training graph is warned once."""
    if job.runtime_cls is EagerRuntime and job.settings.runtime == AUTO:
        # no runtime of the target runs here (the registry warned once): Dynamo's own graph
        # runs, so the outputs are eager's to the bit (TF32 on a GPU included)
        where = "runs on a CUDA device" if job.on_cuda else "is installed"
        return StaysEager("eager", f"no runtime of target {job.backend.name!r} {where}")
    blocker = inference_blocker(gm, example_inputs, analysis)
    if blocker is not None:
        warnings.warn(
            f"embedl_{job.backend.name}: this graph runs eagerly, not frozen for inference: "
            f"{blocker}",
            RuntimeWarning,
            stacklevel=3,
        )
        return StaysEager("training", blocker)
    if job.report.ops < job.settings.min_subgraph_size:
        size = job.settings.min_subgraph_size
        return StaysEager("eager", f"{job.report.ops} ops < min_subgraph_size={size}")
    return None


def _int_positions(frozen: FrozenGraph) -> list[int]:
    """Positions, among the user inputs, of the Python ints taken as 0-d int64 tensors."""
    return [frozen.user_inputs.index(i) for i in frozen.int_inputs]


def _user_inputs(frozen: FrozenGraph, example_inputs: Sequence[Any]) -> list[Any]:
    """The example values of the inputs the frozen graph takes, ints as 0-d int64 tensors (the
    int's example value without a guard on it: ``int()`` would specialize the graph to it)."""
    ints = _int_positions(frozen)
    inputs = [example_inputs[i] for i in frozen.user_inputs]
    return [torch.tensor(optimization_hint(v)) if k in ints else v for k, v in enumerate(inputs)]


def _axes(
    gm: fx.GraphModule, frozen: FrozenGraph, split: SplitOutputs, job: SubgraphJob
) -> DynamicAxes:
    """The dynamic axes of the graph's tensor inputs and outputs (written-back inputs last)."""
    axes = dynamic_axes(gm, frozen.user_inputs, job.inputs, job.settings.dynamic_batch)
    numbers = split.scalars.positions if split.scalars is not None else ()
    outputs = tuple(a for i, a in enumerate(axes.outputs) if i not in numbers)
    outputs += tuple(axes.inputs[k] for k in frozen.written)  # written-back inputs
    return dataclasses.replace(axes, outputs=outputs)
