"""Writes through views made functional, as AOTAutograd's functionalization does.

``y[..., :4].zero_()``, ``y.chunk(2)[0].add_(1)``, ``y.view(-1).add_(1)``, ``x[:, :2].zero_()``
on an input, and ``y.add_(1)`` while a view ``y[0]`` is read later: the write changes every
tensor sharing the storage. Each such write, in graph order, becomes

* ``c = view.clone(); c.op_(...)``: the op on a tensor nothing else reads (made functional
  later, like any other in-place op);
* the base's new value: ``base.reshape(-1).scatter(0, positions, c.reshape(-1))`` reshaped to
  the base, where ``positions`` are the base's flat element indices taken through the same
  view ops (``ones_like(base).cumsum - 1``, then ``[..., :4]``): AOTAutograd's ``*_scatter``
  ops, one form for every view op;
* every alias read after the write (the base, the view, other views of it) is read from the
  new value, its view ops replayed on it.

A base that is a graph input gets its final value returned, for the caller to copy into the
caller's tensor (``write_back``). Views are followed through the ops PyTorch defines by logical
position (slicing, ``select``, ``narrow``, ``view``/``reshape``, ``transpose``/``permute``,
``.T``, ``squeeze``/``unsqueeze``, ``chunk``/``split``/``unbind``; ``diagonal`` of at most 2**24
elements, whose positions ONNX exporters take through float32). A write through any
other alias (``as_strided``, ``expand``, a dtype view), into a frozen constant, or into an input
without ``write_back``, is refused with the reason (:func:`view_write_plan`).
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.aliasing import is_torch_op, out_argument
from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of, analyze
from embedl_dynamo.graph.meta import infer_meta

__all__ = [
    "POSITIONS_META",
    "REPLAYABLE_VIEWS",
    "functionalize_view_writes",
    "inputs_written_through_views",
    "view_position",
    "view_write_plan",
]

#: marks the running count that numbers a tensor's elements (0 .. numel-1) for a scatter: an
#: int64 sum a runtime computing int32 still gets exact below 2**31 elements
POSITIONS_META = "embedl_element_positions"

#: view ops that select elements by logical position, replayable on an index tensor
REPLAYABLE_VIEWS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "t",
        "transpose",
        "permute",
        "narrow",
        "select",
        "diagonal",
        "movedim",
        "swapaxes",
        "swapdims",
        "detach",
        "__getitem__",
        "getitem",
        "T",
        "mT",
    }
)
_SPLITS = frozenset({"chunk", "split", "unbind", "tensor_split", "split_with_sizes"})


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function" and node.target is builtins.getattr:
        return str(node.args[1]) if len(node.args) == 2 else ""  # y.T, y.mT
    if node.op == "call_function" and (node.target is operator.getitem or is_torch_op(node.target)):
        return getattr(node.target, "__name__", "")
    return ""


def _dtype(node: Any) -> Any:
    value = node.meta.get("example_value", node.meta.get("val"))
    return getattr(value, "dtype", None)


def _link(node: fx.Node, keys: Mapping[fx.Node, Any]) -> tuple[fx.Node, list[fx.Node]] | None:
    """``(source, ops)`` when ``node`` is a replayable view of ``source``: ``ops`` replayed on
    ``source`` give ``node`` (a split and its ``getitem``); else None."""
    name = _name(node)
    if name not in REPLAYABLE_VIEWS or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    ops, source = [node], node.args[0]
    if name in ("getitem", "__getitem__") and _name(source) in _SPLITS:
        ops, source = [source, node], source.args[0]
        if not isinstance(source, fx.Node):
            return None
    elif keys.get(source) is None:  # a getitem of a tuple that is no split
        return None
    if keys.get(node) is None or keys.get(node) != keys.get(source):
        return None  # not a view here (reshape that copied, advanced indexing)
    if _dtype(node) != _dtype(source):
        return None
    if name == "diagonal" and not _float_exact(source):
        return None  # ONNX exporters take the diagonal of an int64 grid through float32
    return source, ops


def _float_exact(node: fx.Node) -> bool:
    """Whether ``node``'s element positions are exact in float32 (at most 2**24 elements)."""
    value = node.meta.get("example_value", node.meta.get("val"))
    numel = getattr(value, "numel", lambda: None)()
    return isinstance(numel, int) and numel <= 2**24


def _chain(node: fx.Node, keys: Mapping[fx.Node, Any]) -> tuple[fx.Node, list[fx.Node]]:
    """The node ``node`` is a view of through replayable ops, and those ops, base first."""
    ops: list[fx.Node] = []
    while (link := _link(node, keys)) is not None:
        node, ops = link[0], link[1] + ops
    return node, ops


def view_position(node: fx.Node, analysis: GraphAnalysis) -> tuple[fx.Node, list[fx.Node]]:
    """The base tensor ``node`` is an alias of and the view ops from it to ``node``, through
    in-place ops (``y[0].zero_()`` is ``y[0]``) and replayable views, as ``analysis`` (of
    ``node``'s graph) has them."""
    root = analysis.roots[node]
    base, ops = _chain(root, analysis.classes)
    if base is root:
        return root, []
    base, before = view_position(base, analysis)
    return base, before + ops


def _writes(analysis: GraphAnalysis) -> list[tuple[fx.Node, fx.Node]]:
    return [(node, t) for node, t in analysis.mutated.items() if isinstance(t, fx.Node)]


def view_write_plan(
    gm: fx.GraphModule, write_back: bool, analysis: GraphAnalysis | None = None
) -> tuple[set[fx.Node], str | None]:
    """The in-place ops :func:`functionalize_view_writes` makes functional (those whose
    storage is written through a view, or read through another alias after a write), or the
    reason one of them cannot be; ``analysis`` is ``gm``'s, where the caller has it."""
    analysis = analysis_of(gm, analysis)
    keys = analysis.classes
    marked = set()
    for node, target in _writes(analysis):
        if target in keys and (
            _chain(target, keys)[1]
            or _read_alias(node, target, analysis.members[keys[target]], analysis)
        ):
            marked.add(keys[target])
    handled = {node for node, target in _writes(analysis) if keys.get(target) in marked}
    sources = analysis.inputs
    for key in marked:
        members = [n for n in analysis.members[key] if n.op != "output"]
        roots = {view_position(n, analysis)[0] for n in members}
        if len(roots) != 1:
            names = ", ".join(sorted(r.name for r in roots))
            return handled, f"{names} share storage through an op other than a view by position"
        root = next(iter(roots))
        if root.op == "get_attr" or (root.op == "placeholder" and not write_back):
            return handled, f"the graph writes into {root.target} through a view"
        if root.op == "placeholder" and sum(keys[s] == key for s in sources) != 1:
            return handled, f"{root.target} shares its storage with another input"
    for node in handled:
        if out_argument(node) is not None:
            return handled, f"{node.name} writes into an out= tensor"
    return handled, None


def inputs_written_through_views(
    gm: fx.GraphModule, analysis: GraphAnalysis | None = None
) -> set[fx.Node]:
    """The placeholders :func:`functionalize_view_writes` returns a final value for
    (``analysis``: ``gm``'s, where the caller has it)."""
    analysis = analysis_of(gm, analysis)
    handled, reason = view_write_plan(gm, True, analysis)
    if reason is not None:
        return set()
    bases = {view_position(node.args[0], analysis)[0] for node in handled}
    return {node for node in bases if node.op == "placeholder"}


def _read_alias(
    node: fx.Node, target: fx.Node, storage_class: tuple[fx.Node, ...], analysis: GraphAnalysis
) -> bool:
    """Whether another tensor sharing ``target``'s storage (the nodes of ``storage_class``)
    is read after ``node`` writes."""
    order, roots = analysis.order, analysis.roots
    same = roots[target]
    for other in storage_class:
        if other is node or order.get(other, order[node]) >= order[node]:
            continue
        if roots[other] is not same and any(order[u] > order[node] for u in other.users):
            return True
    return False


def _replay(graph: fx.Graph, ops: list[fx.Node], base: fx.Node) -> fx.Node:
    """``ops`` (a view chain) copied onto ``base``, at the graph's insertion point: each op
    takes the value before it as its first argument."""
    value = base
    for op in ops:
        first = op.args[0]
        value = graph.node_copy(op, lambda a, v=value, f=first: v if a is f else a)
    return value


def functionalize_view_writes(
    gm: fx.GraphModule, write_back: bool, analysis: GraphAnalysis | None = None
) -> dict[fx.Node, fx.Node]:
    """Make the writes :func:`view_write_plan` lists functional (see the module), in place.

    ``analysis`` is ``gm``'s, where the caller has it. Each write changes the graph, so the
    next is planned from a new analysis of the graph as that write left it.

    Returns:
        Each placeholder written through a view (or read through a view after a write), with
        the node holding its final value.

    Raises:
        ValueError: the plan's reason.
    """
    analysis = analysis_of(gm, analysis)
    handled, reason = view_write_plan(gm, write_back, analysis)
    if reason is not None:
        raise ValueError(reason)
    if not handled:
        return {}
    inputs = {view_position(n.args[0], analysis)[0] for n in handled}
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and n in inputs]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = output.args[0]
    output.args = ((returned, *inputs),)  # read last: redirected to each input's final value
    for node in [n for n in gm.graph.nodes if n in handled]:
        _rewrite(gm, node, analyze(gm))  # the graph as the last write (or output) left it
    final = dict(zip(inputs, output.args[0][1:]))
    output.args = (output.args[0][0],)
    gm.graph.lint()
    gm.recompile()
    return final


def _rewrite(gm: fx.GraphModule, node: fx.Node, analysis: GraphAnalysis) -> None:
    """One write: the clone it writes, the base's new value, later aliases read from it."""
    graph, target = gm.graph, node.args[0]
    base, ops = view_position(target, analysis)
    keys, order = analysis.classes, analysis.order
    # aliases made after the write: their recorded values still share the old storage
    stale = {n for n in keys if keys[n] == keys[target] and order.get(n, -1) > order[node]}
    later = [
        (alias, [u for u in alias.users if order[u] > order[node]])
        for alias in keys
        if keys[alias] == keys[target] and order.get(alias, order[node]) < order[node]
    ]
    later.append((node, list(node.users)))  # the write's result is the view, written
    with graph.inserting_before(node):
        copy = graph.call_method("clone", (target,))
    node.args = (copy, *node.args[1:])
    written = copy if node.target is operator.setitem else node
    with graph.inserting_before(node.next):
        new_base = _scatter(graph, base, ops, written) if ops else written
        for alias, users in later:
            if not users:
                continue
            position = view_position(target if alias is node else alias, analysis)[1]
            replacement = _replay(graph, position, new_base)
            for user in users:
                user.replace_input_with(alias, replacement)
    infer_meta(gm, [n for n in graph.nodes if n not in order or n is node or n in stale])


def _scatter(graph: fx.Graph, base: fx.Node, ops: list[fx.Node], value: fx.Node) -> fx.Node:
    """``base`` with ``value`` written where ``ops`` select: its flat element positions
    through the same ops, a scatter, reshaped back."""
    ones = graph.call_function(torch.ones_like, (base,), {"dtype": torch.int64})
    counts = graph.call_method("cumsum", (graph.call_method("reshape", (ones, -1)), 0))
    counts.meta[POSITIONS_META] = True
    grid = graph.call_method("reshape_as", (graph.call_method("sub", (counts, 1)), base))
    index = graph.call_method("reshape", (_replay(graph, ops, grid), -1))
    index = graph.call_method("to", (index, torch.int64))  # diagonal's export: float32
    source = graph.call_method("reshape", (value, -1))
    flat = graph.call_method("reshape", (base, -1))
    scattered = graph.call_method("scatter", (flat, 0, index, source))
    return graph.call_method("reshape_as", (scattered, base))
