"""How much of a model a target's runtimes would compute, decided without building anything.

:func:`coverage` traces the model with Dynamo (as ``torch.compile`` does, under
``torch.inference_mode``), freezes each graph and partitions it by capability exactly as the
``embedl_*`` backends do (:func:`~embedl_dynamo.dynamo.compile.prepare_subgraph`,
:func:`~embedl_dynamo.dynamo.partitioned.partition_for`), then runs the model in PyTorch. It
answers "which ops would stay in PyTorch, and why" in about the time of a trace: the project's
coverage gate runs it on every model of its zoo. FLOPs are counted per node with PyTorch's
``FlopCounterMode`` on the example inputs.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._dynamo.utils import counters

from embedl_dynamo.backend import backend_by_name
from embedl_dynamo.dynamo.compile import StaysEager, prepare_subgraph
from embedl_dynamo.dynamo.partitioned import partition_for
from embedl_dynamo.dynamo.subgraph_job import route_subgraph
from embedl_dynamo.partition import Partitioning, call_flops, compute_nodes, node_flops
from embedl_dynamo.runtimes.registry import runtime_settings
from embedl_dynamo.settings import Settings

__all__ = ["GRAPH_BREAK", "CoverageReport", "GraphCoverage", "KeptOp", "coverage"]

#: the op name :attr:`CoverageReport.kept` gives code Dynamo left out of its graphs
GRAPH_BREAK = "graph break"


@dataclasses.dataclass(frozen=True)
class KeptOp:
    """An op kept in PyTorch, why, and on how many nodes.

    Example:
        ```python
        for kept in embedl_dynamo.coverage(model.eval(), (x,), backend="openvino").kept:
            print(kept.op, kept.nodes, kept.reason)
        ```
    """

    op: str
    reason: str
    count: int


@dataclasses.dataclass
class GraphCoverage:
    """One Dynamo graph: its compute nodes and FLOPs, those on a runtime, what stays and why."""

    ops: int
    ops_on_runtime: int
    flops: int
    flops_on_runtime: int
    runtimes: tuple[str, ...]
    kept: list[tuple[str, str]]  # (op, reason) per node kept in PyTorch


@dataclasses.dataclass
class CoverageReport:
    """What [coverage][embedl_dynamo.coverage] found, over every Dynamo graph of the model.

    Example:
        ```python
        report = embedl_dynamo.coverage(model.eval(), (x,), backend="openvino")
        print(report.op_share, [(k.op, k.reason) for k in report.kept])
        ```
    """

    graphs: list[GraphCoverage]
    #: where Dynamo left code out of its graphs (a graph break, a frame it skipped), which
    #: runs in PyTorch: Dynamo's reason, as ``(GRAPH_BREAK, reason)`` per occurrence
    breaks: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: the model's FLOPs in one eager call (``FlopCounterMode``), in graphs or not
    eager_flops: int = 0

    @property
    def op_share(self) -> float:
        """The share of the graphs' compute nodes placed on a runtime (code Dynamo left out of
        its graphs has no nodes: see `breaks` and `flop_share`)."""
        total = sum(g.ops for g in self.graphs)
        return sum(g.ops_on_runtime for g in self.graphs) / total if total else 1.0

    @property
    def flop_share(self) -> float:
        """The share of the model's FLOPs placed on a runtime, those of code outside Dynamo's
        graphs counted (1.0 for a model without any)."""
        total = max(sum(g.flops for g in self.graphs), self.eager_flops)
        return sum(g.flops_on_runtime for g in self.graphs) / total if total else 1.0

    @property
    def kept(self) -> list[KeptOp]:
        """The ops kept in PyTorch with their reasons, most frequent first; Dynamo's graph
        breaks and skipped frames as op `"graph break"`."""
        counts = collections.Counter([*(k for g in self.graphs for k in g.kept), *self.breaks])
        return [KeptOp(op, reason, n) for (op, reason), n in counts.most_common()]

    @property
    def fully_on_runtime(self) -> bool:
        """Whether no compute node stays in PyTorch and Dynamo left no code out of its graphs."""
        return not self.breaks and all(not g.kept for g in self.graphs)


def coverage(
    model: nn.Module,
    example_inputs: Sequence[Any],
    backend: str = "onnxruntime",
    **options: Any,
) -> CoverageReport:
    """Trace ``model`` and decide, per node, where its ops would run; build nothing.

    Args:
        model: the model (not modified).
        example_inputs: one call's positional inputs.
        backend: the target (``onnxruntime``, ``openvino``, ``tensorrt``; ``embedl_`` may
            prefix it).
        options: compile options (`embedl_dynamo.settings.Settings`), e.g. ``runtime``.

    Returns:
        A [CoverageReport][embedl_dynamo.CoverageReport].

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> report = coverage(model.eval(), (torch.randn(1, 4),), backend="onnxruntime")
        >>> report.fully_on_runtime, report.op_share
        (True, 1.0)
    """
    target = backend_by_name(backend.removeprefix("embedl_"))
    settings = runtime_settings(options or None)
    graphs: list[GraphCoverage] = []

    def decide(gm: fx.GraphModule, inputs: Sequence[Any]) -> Any:
        graphs.append(_graph_coverage(gm, inputs, target, settings))
        return gm.forward

    torch._dynamo.reset()
    before = _dynamo_breaks()
    try:
        with torch.inference_mode():
            torch.compile(model, backend=decide)(*example_inputs)
            breaks = _dynamo_breaks() - before
    finally:
        torch._dynamo.reset()
    kept = [(GRAPH_BREAK, reason) for reason in sorted(breaks.elements())]
    return CoverageReport(graphs, kept, call_flops(model, example_inputs))


def _dynamo_breaks() -> collections.Counter[str]:
    """Dynamo's graph breaks and skipped frames so far in this process, by the first line of
    its message and its first hint (its counters, which ``torch._dynamo.reset`` keeps)."""
    found: collections.Counter[str] = collections.Counter()
    for kind in ("graph_break", "unimplemented"):
        for message, count in counters[kind].items():
            lines = [line.strip() for line in str(message).strip().splitlines()]
            hints = [line for line in lines if line.startswith("Hint:")]
            found[f"{lines[0]} ({hints[0]})" if hints else lines[0]] += count
    return found


def _graph_coverage(
    gm: fx.GraphModule, inputs: Sequence[Any], target: Any, settings: Settings
) -> GraphCoverage:
    job = route_subgraph(gm, inputs, target, settings)
    prepared = prepare_subgraph(job, gm, inputs)
    if isinstance(prepared, StaysEager):
        nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
        kept = [(_op(n), prepared.reason) for n in nodes]
        flops = _flops(gm, list(inputs), set(nodes))
        return GraphCoverage(len(nodes), 0, flops, 0, (), kept)
    graph = prepared.split.tensors
    partitioning = partition_for(job, graph)
    nodes = compute_nodes(graph)
    if partitioning is None:
        flops = _flops(graph, job.inputs, set(nodes))
        return GraphCoverage(len(nodes), len(nodes), flops, flops, (job.runtime_cls.name,), [])
    return _partitioned_coverage(graph, job.inputs, partitioning, nodes)


def _partitioned_coverage(
    graph: fx.GraphModule, inputs: list[Any], partitioning: Partitioning, nodes: list[fx.Node]
) -> GraphCoverage:
    placed = {n for f in partitioning.fragments for n in f.nodes}
    flops = _flops(graph, inputs, set(nodes))
    on_runtime = _flops(graph, inputs, placed & set(nodes))
    runtimes = tuple(dict.fromkeys(f.runtime for f in partitioning.fragments))
    kept = [(k.op, k.reason) for k in partitioning.kept]
    return GraphCoverage(
        partitioning.ops, partitioning.ops_on_runtimes, flops, on_runtime, runtimes, kept
    )


def _op(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def _flops(gm: fx.GraphModule, inputs: list[Any], counted: set[fx.Node]) -> int:
    return sum(node_flops(gm, inputs, counted).values())
