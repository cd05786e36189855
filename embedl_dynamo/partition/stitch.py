"""The partitioned graph: PyTorch's nodes as they were, each fragment one call of its runtime.

:func:`stitch` rebuilds the graph in a topological order of the condensed graph (a fragment is
one node there, as torch.fx's ``fuse_by_partitions`` orders it), so that every fragment runs
once its inputs exist and before its outputs are read. :func:`fragment_inputs` runs the graph
in PyTorch to find what each fragment receives: its example inputs, and its calibration
batches (calibration runs the whole partitioned graph).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.aliasing import mutated_tensor
from embedl_dynamo.partition.fragments import Fragment
from embedl_dynamo.partition.support import is_free, picks_output

__all__ = ["FragmentCall", "can_stitch", "fragment_inputs", "stitch"]


class FragmentCall:
    """A fragment's runtime call in the partitioned graph: ``infer`` on its inputs, a tuple of
    its outputs back."""

    def __init__(self, infer: Callable[..., Any], name: str) -> None:
        self.infer = infer
        self.__name__ = name

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        return tuple(self.infer(*inputs))


def _data_edges(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """``(source, reader)`` for every value a node reads."""
    return [(source, node) for node in gm.graph.nodes for source in node.all_input_nodes]


def _write_edges(gm: fx.GraphModule, position: dict[fx.Node, int]) -> list[tuple[fx.Node, fx.Node]]:
    """``(earlier, later)`` between each in-place write the graph still holds and the other
    readers of its tensor's values, in the graph's order: a reader before the write must not
    see it, a reader after it must (data flow alone does not order them). A size read from it,
    recomputed wherever it is read, and a pick of an op's output are no such readers."""
    edges = []
    for node in gm.graph.nodes:
        written = mutated_tensor(node)
        if not isinstance(written, fx.Node):
            continue
        for reader in written.users:
            if reader is not node and not is_free(reader) and not picks_output(reader):
                pair = (reader, node) if position[reader] < position[node] else (node, reader)
                edges.append(pair)
    return edges


def _condensed_order(gm: fx.GraphModule, fragments: Sequence[Fragment]) -> list[Any]:
    """Nodes outside fragments and fragment indices, topologically, graph order on ties."""
    owner = {node: k for k, fragment in enumerate(fragments) for node in fragment.nodes}
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    units: dict[Any, int] = {}  # unit -> its first position
    for node in gm.graph.nodes:
        unit = ("fragment", owner[node]) if node in owner else node
        units.setdefault(unit, position[node])
    waiting: dict[Any, set[Any]] = {unit: set() for unit in units}
    readers: dict[Any, set[Any]] = {unit: set() for unit in units}
    for before_node, node in [*_data_edges(gm), *_write_edges(gm, position)]:
        unit = ("fragment", owner[node]) if node in owner else node
        before = ("fragment", owner[before_node]) if before_node in owner else before_node
        if before != unit:
            waiting[unit].add(before)
            readers[before].add(unit)
    ready = [(units[u], k, u) for k, u in enumerate(units) if not waiting[u]]
    index = {u: k for k, u in enumerate(units)}
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, unit = heapq.heappop(ready)
        order.append(unit)
        for reader in readers[unit]:
            waiting[reader].discard(unit)
            if not waiting[reader]:
                heapq.heappush(ready, (units[reader], index[reader], reader))
    if len(order) != len(units):
        raise ValueError("the partition has a cycle between fragments")
    return order


def can_stitch(gm: fx.GraphModule, fragments: Sequence[Fragment]) -> bool:
    """Whether :func:`stitch` can order ``fragments`` and the nodes between them: no data
    dependence or in-place write orders two fragments both ways."""
    try:
        _condensed_order(gm, fragments)
    except ValueError:
        return False
    return True


def stitch(
    gm: fx.GraphModule, fragments: Sequence[Fragment], calls: Sequence[Callable[..., Any]]
) -> fx.GraphModule:
    """``gm`` with each fragment replaced by one call of ``calls[k]`` (its inputs in, a tuple
    of its outputs back); ``gm`` is not modified."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for unit in _condensed_order(gm, fragments):
        if not isinstance(unit, tuple):
            env[unit] = graph.node_copy(unit, env.__getitem__)
            continue
        k = unit[1]
        fragment = fragments[k]
        call = graph.call_function(
            FragmentCall(calls[k], f"fragment{k}_{fragment.runtime}"),
            tuple(env[n] for n in fragment.inputs),
        )
        for position, node in enumerate(fragment.outputs):
            env[node] = graph.call_function(operator.getitem, (call, position))
            env[node].meta = dict(node.meta)
    stitched = fx.GraphModule(gm, graph, class_name="Partitioned")
    stitched.meta.update(getattr(gm, "meta", {}))
    return stitched


class _Recorder(fx.Interpreter):
    """Runs the graph in PyTorch and keeps the values of the nodes asked for."""

    def __init__(self, gm: fx.GraphModule, wanted: set[fx.Node]) -> None:
        super().__init__(gm)
        self.wanted = wanted
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n in self.wanted:
            self.values[n] = value
        return value


def fragment_inputs(
    gm: fx.GraphModule, fragments: Sequence[Fragment], batches: Sequence[Sequence[Any]]
) -> list[list[tuple[Any, ...]]]:
    """What each fragment receives when ``gm`` runs in PyTorch on each of ``batches``: one
    list per fragment, one tuple of its inputs per batch."""
    wanted = {node for fragment in fragments for node in fragment.inputs}
    found: list[list[tuple[Any, ...]]] = [[] for _ in fragments]
    with torch.no_grad():
        for batch in batches:
            recorder = _Recorder(gm, wanted)
            recorder.run(*batch)
            for k, fragment in enumerate(fragments):
                found[k].append(tuple(recorder.values[n] for n in fragment.inputs))
    return found
