"""Partition a frozen, functional graph by capability: runtime fragments and PyTorch nodes.

As Torch-TensorRT does (``dynamo/partitioning/``), torch.fx's ``CapabilityBasedPartitioner``
groups the nodes a runtime computes exactly (:class:`~.support.RuntimeSupport`) into the
largest fragments that keep the graph acyclic; the nodes no runtime takes stay in PyTorch,
each with its reason. Several runtimes are tried in order (the target's runtime first), each
on what the ones before it left: ONNX Runtime may take the integer comparisons OpenVINO
computes through float32. A fragment of fewer than ``min_ops`` compute nodes stays in PyTorch,
as ``min_subgraph_size`` keeps small graphs there.

Each fragment becomes a graph of its own (:attr:`Fragment.graph`): its inputs are the tensors
it reads from outside, its constants are copied in, and the sizes it reads
(:func:`~.support.is_free`) are recomputed inside from the tensors they come from.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
from torch import fx, nn
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from embedl_dynamo.graph.aliasing import mutated_tensor
from embedl_dynamo.partition.support import CALLS, RuntimeSupport, is_free, picks_output

__all__ = [
    "Fragment",
    "KeptNode",
    "Partitioning",
    "compute_nodes",
    "fragment_of",
    "is_compute_node",
    "partition_graph",
]


@dataclasses.dataclass(frozen=True)
class KeptNode:
    """A compute node that stays in PyTorch: its name in the graph, its op, and why;
    ``small``: a runtime computes it, but its fragment was below the minimum size."""

    node: str
    op: str
    reason: str
    small: bool = False


@dataclasses.dataclass
class Fragment:
    """Nodes one runtime computes, as a graph of their own.

    Attributes:
        runtime: the runtime's name.
        nodes: the fragment's nodes in the partitioned graph, in graph order.
        inputs: the nodes outside it whose tensors it reads, in its placeholders' order.
        outputs: its nodes read outside it, in its outputs' order.
        graph: the fragment as a GraphModule (a tuple of ``outputs``).
    """

    runtime: str
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    graph: fx.GraphModule

    @property
    def ops(self) -> int:
        """Its compute nodes (:func:`is_compute_node`: the sizes it reads and the picks of one
        output are no compute nodes, as in the graph's count)."""
        return sum(1 for n in self.nodes if is_compute_node(n))


@dataclasses.dataclass
class Partitioning:
    """Where each compute node of a graph runs.

    Attributes:
        fragments: the runtime fragments, in graph order.
        kept: the compute nodes that stay in PyTorch, and why.
        ops: the graph's compute nodes.
    """

    fragments: list[Fragment]
    kept: list[KeptNode]
    ops: int

    @property
    def whole(self) -> bool:
        """Whether one fragment computes every compute node (nothing stays in PyTorch)."""
        return len(self.fragments) == 1 and not self.kept

    @property
    def blocker(self) -> KeptNode | None:
        """The first node kept because no runtime computes it exactly (not for size)."""
        return next((k for k in self.kept if not k.small), None)

    @property
    def ops_on_runtimes(self) -> int:
        return sum(f.ops for f in self.fragments)


def is_compute_node(node: fx.Node) -> bool:
    """Whether ``node`` computes a tensor (not a size, not a pick of one output, not dead
    code): what coverage counts, in a graph and in a fragment alike."""
    return node.op in CALLS and not is_free(node) and not picks_output(node) and bool(node.users)


def compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that compute a tensor (:func:`is_compute_node`), in graph order."""
    return [n for n in gm.graph.nodes if is_compute_node(n)]


def partition_graph(
    gm: fx.GraphModule,
    runtimes: Sequence[str],
    min_ops: int = 1,
    forced_out: Iterable[str] = (),
    held: Mapping[str, Mapping[fx.Node, str]] | None = None,
) -> Partitioning:
    """Partition ``gm`` (frozen, functional; not modified) over ``runtimes``, in order.

    Args:
        gm: the graph.
        runtimes: runtime names, the preferred first; each takes what it computes exactly of
            what the ones before it left.
        min_ops: a fragment with fewer compute nodes stays in PyTorch.
        forced_out: op names kept in PyTorch whatever the table says.
        held: per runtime name, the nodes that runtime may not take whatever their op, each
            with why (it failed on them: :mod:`embedl_dynamo.dynamo.narrowing`); a later
            runtime of ``runtimes`` may take them.
    """
    apart: dict[fx.Node, str] = {}  # split at in-place writes: no runtime takes them
    while True:
        held_from = {r: {**apart, **(held or {}).get(r, {})} for r in runtimes}
        taken, reasons, small, chosen = _propose(gm, runtimes, min_ops, forced_out, held_from)
        chosen = _cut_at_writes(gm, chosen, min_ops, (taken, reasons, small))
        split = _split_writes(gm, chosen)
        if not split:
            break
        apart.update(dict.fromkeys(split - apart.keys(), _WRITE_SPLIT))
    fragments = []
    for runtime, nodes in chosen:
        fragment = fragment_of(gm, runtime, nodes)
        if fragment.inputs:
            fragments.append(fragment)
            continue
        taken.difference_update(nodes)  # constants only: nothing a runtime would gain
        small.update(nodes)
        for node in nodes:
            reasons[node] = "a fragment without inputs only computes constants"
    computed = compute_nodes(gm)
    kept = [
        KeptNode(n.name, _op(n), reasons.get(n, "no runtime takes it"), n in small)
        for n in computed
        if n not in taken
    ]
    return Partitioning(fragments, kept, len(computed))


_WRITE_SPLIT = (
    "an in-place write whose tensor is read in another part: the write and every reader of "
    "the tensor run in PyTorch, in the graph's order"
)


def _propose(
    gm: fx.GraphModule,
    runtimes: Sequence[str],
    min_ops: int,
    forced_out: Iterable[str],
    held: Mapping[str, dict[fx.Node, str]],
) -> tuple[set[fx.Node], dict[fx.Node, str], set[fx.Node], list[tuple[str, list[fx.Node]]]]:
    """Each runtime's fragments of what the ones before it left, but the nodes ``held`` holds
    from it: ``(taken, reasons, small, chosen)``, chosen as ``(runtime, nodes)`` in graph
    order."""
    taken: set[fx.Node] = set()
    reasons: dict[fx.Node, str] = {}
    small: set[fx.Node] = set()
    chosen: list[tuple[str, list[fx.Node]]] = []
    for runtime in runtimes:
        support = RuntimeSupport(runtime, taken, forced_out, held[runtime])
        partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
        with _indexing_apart_from_picks(gm):
            proposed = partitioner.propose_partitions()
        for partition in proposed:
            nodes = [n for n in gm.graph.nodes if n in partition.nodes]
            count = sum(1 for n in nodes if not picks_output(n))
            if count < min_ops:
                small.update(nodes)
                for node in nodes:
                    reasons.setdefault(
                        node, f"a fragment of {count} ops < min_subgraph_size={min_ops}"
                    )
                continue
            chosen.append((runtime, nodes))
            taken.update(nodes)
        for node, reason in support.reasons.items():
            reasons.setdefault(node, reason)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    chosen.sort(key=lambda item: order[item[1][0]])
    return taken, reasons, small, chosen


def _writes(gm: fx.GraphModule) -> Iterator[tuple[fx.Node, fx.Node | None, set[fx.Node]]]:
    """Per in-place write left in the graph (a ``setitem``, or an op without an out-of-place
    form, into a tensor no other tensor aliases: :mod:`embedl_dynamo.graph.functionalize`
    leaves them, as the graph's order says which readers see them): the write, the written
    tensor's producer (None: a graph input or constant) and the other nodes that read it."""
    for node in gm.graph.nodes:
        written = mutated_tensor(node)
        if not isinstance(written, fx.Node):
            continue
        readers = {n for n in written.users if n is not node}
        readers = {n for n in readers if not is_free(n) and not picks_output(n)}
        yield node, written if written.op in CALLS else None, readers


def _cut_at_writes(
    gm: fx.GraphModule,
    chosen: list[tuple[str, list[fx.Node]]],
    min_ops: int,
    state: tuple[set[fx.Node], dict[fx.Node, str], set[fx.Node]],
) -> list[tuple[str, list[fx.Node]]]:
    """Each part cut where an in-place write that runs in PyTorch stands among its nodes, so
    that a part runs wholly before or wholly after each such write: the stitched graph runs
    the write after the readers before it and before those after it, and a part on both sides
    of it would wait on itself (Longformer's masked diagonals). A piece below ``min_ops``
    stays in PyTorch (``state``: the nodes taken, the reasons and the small ones, updated)."""
    taken, reasons, small = state
    placed = {node for _, nodes in chosen for node in nodes}
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    cuts = sorted(position[write] for write, _, _ in _writes(gm) if write not in placed)
    if not cuts:
        return chosen
    pieces = []
    for runtime, nodes in chosen:
        groups: dict[int, list[fx.Node]] = {}
        for node in nodes:
            anchor = node.args[0] if picks_output(node) else node  # a pick goes with its op
            groups.setdefault(bisect.bisect(cuts, position[anchor]), []).append(node)
        for _, piece in sorted(groups.items()):
            count = sum(1 for n in piece if not picks_output(n))
            if count >= min_ops:
                pieces.append((runtime, piece))
                continue
            taken.difference_update(piece)
            small.update(piece)
            for node in piece:
                reasons[node] = f"a fragment of {count} ops < min_subgraph_size={min_ops}"
    return pieces


def _split_writes(gm: fx.GraphModule, chosen: list[tuple[str, list[fx.Node]]]) -> set[fx.Node]:
    """The writes (:func:`_writes`) not placed in one part with every other reader of their
    tensor,
    with those readers: a part run elsewhere would read the tensor before or after the write,
    against the graph's order (a fragment keeps no order but its data flow). They are to stay
    in PyTorch, in the graph's order, on the tensor its producer gave. A write a fragment
    holds also needs the tensor's producer there (a fragment writes into no input)."""
    part = {node: k for k, (_, nodes) in enumerate(chosen) for node in nodes}
    split: set[fx.Node] = set()
    for write, producer, readers in _writes(gm):
        where = part.get(write)
        apart = len({part.get(n) for n in readers} | {where}) > 1
        if apart or (where is not None and (producer is None or part.get(producer) != where)):
            split |= readers | {write}
    return split


def indexing(tensor: torch.Tensor, index: object) -> torch.Tensor:
    """``tensor[index]``: what a tensor-indexing ``operator.getitem`` node computes."""
    return operator.getitem(tensor, index)


indexing.__name__ = "getitem"  # the op's name for the conformance table and the report


@contextlib.contextmanager
def _indexing_apart_from_picks(gm: fx.GraphModule) -> Iterator[None]:
    """While inside, tensor-indexing ``operator.getitem`` nodes call :func:`indexing`.

    ``CapabilityBasedPartitioner`` moves every ``operator.getitem`` user of a node whose users
    are all ``getitem`` into that node's partition, as the picks of a multi-output op belong
    with it. Applied to indexing, it pulls an index the runtime does not take into a fragment,
    and an indexing that reads two tensors of two partitions (``h[arange(B), lengths - 1]``)
    moves back and forth forever. The graph's nodes are restored on the way out."""
    swapped = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is operator.getitem and not picks_output(n)
    ]
    for node in swapped:
        node.target = indexing
    try:
        yield
    finally:
        for node in swapped:
            node.target = operator.getitem


def _op(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def fragment_of(gm: fx.GraphModule, runtime: str, nodes: list[fx.Node]) -> Fragment:
    """``nodes`` of ``gm`` (a convex set, in graph order) as a GraphModule of their own (see
    the module docstring)."""
    members = set(nodes)
    inputs = _inputs(nodes, members)
    graph = fx.Graph()
    root = nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)

    def value(node: fx.Node) -> fx.Node:
        if node not in env:  # a constant, or a size recomputed here
            if node.op == "get_attr":
                _copy_constant(gm, root, str(node.target))
            env[node] = graph.node_copy(node, value)
        return env[node]

    for node in nodes:
        env[node] = graph.node_copy(node, value)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    module = fx.GraphModule(root, graph, class_name="Fragment")
    module.meta.update(getattr(gm, "meta", {}))
    return Fragment(runtime, nodes, inputs, outputs, module)


def _inputs(nodes: list[fx.Node], members: set[fx.Node]) -> list[fx.Node]:
    """The outside nodes whose tensors ``nodes`` read, directly or through the sizes they
    recompute, in first-read order; constants are copied, not read."""
    found: dict[fx.Node, None] = {}
    seen: set[fx.Node] = set()

    def reach(node: fx.Node) -> None:
        if node in members or node in seen:
            return
        seen.add(node)
        if node.op == "get_attr":
            return
        if is_free(node):
            for source in node.all_input_nodes:
                reach(source)
            return
        found[node] = None

    for node in nodes:
        for source in node.all_input_nodes:
            reach(source)
    return list(found)


def _copy_constant(gm: fx.GraphModule, root: nn.Module, target: str) -> None:
    """Register ``gm``'s constant at ``target`` on ``root`` (same path, same tensor)."""
    *path, name = target.split(".")
    source: object = gm
    owner: nn.Module = root
    for part in path:
        source = getattr(source, part)
        if not hasattr(owner, part):
            owner.add_module(part, nn.Module())
        owner = getattr(owner, part)
    value = getattr(source, name)
    if isinstance(value, nn.Parameter):
        owner.register_parameter(name, value)
    elif isinstance(value, torch.Tensor):
        owner.register_buffer(name, value)
    else:
        setattr(owner, name, value)
