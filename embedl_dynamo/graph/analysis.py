"""One record of a graph's aliasing and in-place writes, computed once per graph state.

Before any rewrite, the graph a Dynamo backend receives is asked the same questions by each
decision: which nodes may share storage (:func:`~embedl_dynamo.graph.aliasing.alias_classes`),
which tensor each node *is* (:func:`~embedl_dynamo.graph.aliasing.identity_root`), which ops
write in place and into what, which inputs are written and which are returned as themselves.
As AOTAutograd computes one ``ViewAndMutationMeta`` per graph and every later stage reads it,
:func:`analyze` computes these facts once into a :class:`GraphAnalysis`, and the decisions
(``mutation_blocker``, ``output_alias``, ``view_write_plan``, ``output_views``, ``freeze``)
read that record, passed down as an argument. A stage that has no record at hand (the folding
of input-free tensors after the graph is made functional) gets the one last computed for the
graph, where the graph has not changed since.

A record describes one state of one graph: a pass that changes the graph (writes through
views made functional, in-place ops made out-of-place, a recorded run's storages noted) calls
:func:`analyze` again after the change. A record of another state is refused, never read
(:func:`analysis_of`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.aliasing import (
    INPLACE_OPERATORS,
    STORAGE_KEY,
    alias_classes,
    identity_root,
    inplace_flag,
    is_torch_op,
    mutated_tensor,
    out_argument,
)

__all__ = ["LATEST_ANALYSIS", "GraphAnalysis", "analysis_of", "analyze", "graph_state"]

#: the attribute of an ``fx.Graph`` holding its latest record, read again while the graph is in
#: the state it describes (it lives and dies with the graph; a copy of the graph has none)
LATEST_ANALYSIS = "embedl_latest_analysis"


def graph_state(gm: fx.GraphModule) -> tuple[tuple[Any, ...], ...]:
    """What a :class:`GraphAnalysis` is keyed by: per node, the node, its target, its
    arguments and whether a recorded run's storage is noted on it (the facts the analysis
    reads change only with one of these). Compared by identity (:meth:`GraphAnalysis.describes`):
    a pass that rewrites a node gives it a new target or new argument tuples.

    Example:
        >>> import torch
        >>> from torch import fx
        >>> gm = fx.symbolic_trace(lambda x: x.add_(1))
        >>> len(graph_state(gm)) == len(gm.graph.nodes)
        True
    """
    return tuple(
        (node, node.target, node.args, node.kwargs, STORAGE_KEY in node.meta)
        for node in gm.graph.nodes
    )


@dataclass(frozen=True, eq=False)
class GraphAnalysis:
    """The aliasing and in-place facts of one graph state (see the module); read-only.

    Attributes:
        state: the :func:`graph_state` it was computed from.
        order: each node's position in the graph.
        classes: a key per node; nodes that may share storage have the same key
            (:func:`~embedl_dynamo.graph.aliasing.alias_classes`).
        members: per key of ``classes``, its nodes in graph order.
        roots: the tensor each node *is*, through in-place ops and ops returning their input
            itself (:func:`~embedl_dynamo.graph.aliasing.identity_root`).
        mutated: each in-place op, in graph order, with what it writes (a node, or a value the
            graph cannot follow) (:func:`~embedl_dynamo.graph.aliasing.mutated_tensor`).
        inputs: the placeholders and ``get_attr`` nodes with a storage key, in graph order.
        outputs: the graph's output values, by output position.
        written_inputs: the in-place ops that can be written back, each with the placeholder
            it writes: a direct write into a placeholder (or into an earlier such op's result)
            with an out-of-place form, into a placeholder that shares its storage with no other
            input. Writes through views, ``setitem`` and ``out=`` are not listed: the caller's
            tensor would need a scatter into a view, not a copy of the whole value.
        returned_inputs: the outputs that are a placeholder's tensor itself (``return x``, or
            ``x`` after in-place writes) and a tensor by Dynamo's example values, by output
            position: a caller returns its own input object there, as eager does, instead of
            the runtime's copy.
        writes_into_input: whether an in-place op may write into a graph input, parameter or
            buffer (running the graph would then change the caller's tensors).

    Example:
        >>> from torch import fx
        >>> gm = fx.symbolic_trace(lambda x: x.add_(1))
        >>> record = analyze(gm)
        >>> [(op.target, written.op) for op, written in record.mutated.items()]
        [('add_', 'placeholder')]
        >>> record.roots[record.outputs[0]].op, record.writes_into_input  # add_ returns x
        ('placeholder', True)
    """

    state: tuple[tuple[Any, ...], ...]
    order: Mapping[fx.Node, int]
    classes: Mapping[fx.Node, Any]
    members: Mapping[Any, tuple[fx.Node, ...]]
    roots: Mapping[fx.Node, fx.Node]
    mutated: Mapping[fx.Node, Any]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[Any, ...]
    written_inputs: Mapping[fx.Node, fx.Node]
    returned_inputs: Mapping[int, fx.Node]
    writes_into_input: bool

    def describes(self, gm: fx.GraphModule) -> bool:
        """Whether this record is of ``gm``'s current state (no node added, removed or
        rewritten since, no storage recorded since).

        Example:
            >>> from torch import fx
            >>> gm = fx.symbolic_trace(lambda x: x.add_(1))
            >>> analyze(gm).describes(gm)
            True
        """
        state = graph_state(gm)
        return len(state) == len(self.state) and all(
            now is then for row, old in zip(state, self.state) for now, then in zip(row, old)
        )


def analyze(gm: fx.GraphModule) -> GraphAnalysis:
    """The :class:`GraphAnalysis` of ``gm`` as it is now: every aliasing and in-place fact the
    decisions before any rewrite read, computed once.

    Example:
        >>> from torch import fx
        >>> gm = fx.symbolic_trace(lambda x: x.add_(1))
        >>> [node.op for node in analyze(gm).written_inputs.values()]
        ['placeholder']
    """
    latest = getattr(gm.graph, LATEST_ANALYSIS, None)
    if latest is not None and latest.describes(gm):
        return latest
    record = _computed(gm)
    setattr(gm.graph, LATEST_ANALYSIS, record)
    return record


def _computed(gm: fx.GraphModule) -> GraphAnalysis:
    nodes = list(gm.graph.nodes)
    classes = alias_classes(gm)
    members: dict[Any, list[fx.Node]] = {}
    for node, key in classes.items():
        members.setdefault(key, []).append(node)
    roots = {node: identity_root(node) for node in nodes}
    mutated = {node: target for node in nodes if (target := mutated_tensor(node)) is not None}
    inputs = tuple(n for n in nodes if n.op in ("placeholder", "get_attr") and n in classes)
    input_keys = {classes[n] for n in inputs}
    outputs = _output_values(nodes)
    return GraphAnalysis(
        state=graph_state(gm),
        order={node: i for i, node in enumerate(nodes)},
        classes=classes,
        members={key: tuple(group) for key, group in members.items()},
        roots=roots,
        mutated=mutated,
        inputs=inputs,
        outputs=outputs,
        written_inputs=_written_inputs(mutated, classes, roots, inputs),
        returned_inputs=_returned_inputs(outputs, roots),
        writes_into_input=any(
            classes.get(target, target) in input_keys
            for target in mutated.values()
            if isinstance(target, fx.Node)
        ),
    )


def analysis_of(gm: fx.GraphModule, analysis: GraphAnalysis | None = None) -> GraphAnalysis:
    """``analysis`` where given (a caller analysed ``gm`` once and passes the record down),
    else :func:`analyze` of ``gm``.

    Raises:
        ValueError: ``analysis`` is of another graph or of an earlier state of ``gm`` (it was
            changed since: analyse it again).

    Example:
        >>> from torch import fx
        >>> gm = fx.symbolic_trace(lambda x: x.add_(1))
        >>> record = analyze(gm)
        >>> analysis_of(gm, record) is record
        True
    """
    if analysis is None:
        return analyze(gm)
    if not analysis.describes(gm):
        raise ValueError("the analysis is of another graph state: analyse the graph again")
    return analysis


def _output_values(nodes: list[fx.Node]) -> tuple[Any, ...]:
    output = next(n for n in reversed(nodes) if n.op == "output")
    returned = output.args[0]
    return tuple(returned) if isinstance(returned, (tuple, list)) else (returned,)


def _returned_inputs(
    outputs: tuple[Any, ...], roots: Mapping[fx.Node, fx.Node]
) -> dict[int, fx.Node]:
    found: dict[int, fx.Node] = {}
    for position, value in enumerate(outputs):
        if isinstance(value, fx.Node):
            root = roots[value]
            tensor = isinstance(root.meta.get("example_value"), torch.Tensor)
            if root.op == "placeholder" and tensor:  # a number input is a number output
                found[position] = root
    return found


def _written_inputs(
    mutated: Mapping[fx.Node, Any],
    classes: Mapping[fx.Node, Any],
    roots: Mapping[fx.Node, fx.Node],
    inputs: tuple[fx.Node, ...],
) -> dict[fx.Node, fx.Node]:
    found: dict[fx.Node, fx.Node] = {}
    for node, target in mutated.items():
        if not isinstance(target, fx.Node) or out_argument(node) is not None:
            continue
        root = roots[target]
        if root.op != "placeholder" or not _has_out_of_place(node):
            continue
        if sum(classes.get(n) == classes.get(root) for n in inputs) != 1:
            continue  # another input shares its storage: a copy into one misses the other
        found[node] = root
    return found


def _has_out_of_place(node: fx.Node) -> bool:
    """Whether :func:`~embedl_dynamo.graph.functionalize.functionalize` turns ``node`` into an
    out-of-place op."""
    if node.op == "call_method":
        return node.target == "copy_" or hasattr(torch.Tensor, str(node.target)[:-1])
    if node.op != "call_function" or node.target is operator.setitem:
        return False
    if node.target in INPLACE_OPERATORS or "inplace" in node.kwargs:
        return True
    if inplace_flag(node):
        return False
    name = getattr(node.target, "__name__", "")[:-1]
    return is_torch_op(node.target) and getattr(torch, name, None) is not None
