"""In-place ops made functional before any rewrite, or the graph refused with the reason.

Every later pass (canonicalisation, patterns, precision, ONNX export) is written for a graph
in which a node's value never changes after it is computed. An in-place op breaks that: a
dead-code pass drops ``y.masked_fill_(m, 0)`` whose result is unused, and a rewrite that reads
``y`` after it reads the old value. So, first of all, each in-place op is either

* made functional: ``y.op_(...)`` becomes ``y2 = y.op(...)`` (the op itself where PyTorch has
  no out-of-place form) and every later reader of ``y`` reads ``y2``. This is exact when ``y``
  has no *live alias*: no other tensor sharing its storage (a view of it, the tensor it is a
  view of, the same tensor returned twice) is read after the op. Or
* written back (``write_back=True``): an op that writes straight into a graph input (a KV
  cache's ``index_copy_``, a counter's ``add_(1)``) is made functional like the others, and the
  input's final value becomes an extra output of the graph, which the caller copies into the
  caller's tensor after the run (as AOTAutograd's epilogue does). Or
* made functional through views (:mod:`embedl_dynamo.graph.view_writes`, first): a write into
  a view (``y[..., :4].zero_()``, ``x[:, :2].zero_()`` on an input or a buffer), or into a
  tensor whose view is read later, becomes a write into a copy and a scatter into the base,
  as AOTAutograd's functionalization does; an input's final value is written back. Or
* refused (:func:`mutation_blocker` names why): the op writes through an alias other than a
  view by position (``as_strided``, a dtype view), into a frozen constant, or into an input
  without ``write_back``; writes into an ``out=`` tensor. The backend then runs that graph in
  PyTorch with one warning, as it does for a graph whose outputs share storage with each
  other or with an input in a way the caller cannot regenerate after the call
  (:func:`output_alias`; :mod:`embedl_dynamo.graph.output_views` regenerates views of a
  returned tensor or of an input).

Aliasing and what each op writes come from :mod:`embedl_dynamo.graph.aliasing`, computed once
per graph state into the record of :mod:`embedl_dynamo.graph.analysis` that every decision
here reads (written and returned inputs are its fields).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.aliasing import (
    INPLACE_OPERATORS,
    inplace_flag,
    is_torch_op,
    mutated_tensor,
    out_argument,
    same_tensor_source,
)
from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of, analyze
from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.output_views import output_views, with_view_bases
from embedl_dynamo.graph.view_writes import functionalize_view_writes, view_write_plan

__all__ = ["functionalize", "mutation_blocker", "output_alias"]


def _drop_same_tensor_nodes(gm: fx.GraphModule) -> bool:
    """Read the input itself wherever a node returns its input as the same tensor."""
    dropped = False
    for node in list(gm.graph.nodes):
        source = same_tensor_source(node)
        if source is not None:
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            dropped = True
    return dropped


def _output_values(gm: fx.GraphModule) -> tuple[Any, ...]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = output.args[0]
    return tuple(returned) if isinstance(returned, (tuple, list)) else (returned,)


def mutation_blocker(
    gm: fx.GraphModule,
    name_of: Callable[[fx.Node], str] | None = None,
    write_back: bool = False,
    analysis: GraphAnalysis | None = None,
) -> str | None:
    """Why ``gm``'s in-place ops cannot be made functional exactly, or None (see the module).

    Args:
        gm: the graph, with Dynamo's example values or :func:`record_storages`' keys if known.
        name_of: names a graph input in the message (default: the node's name).
        write_back: direct writes into placeholders are allowed
            (:attr:`~embedl_dynamo.graph.analysis.GraphAnalysis.written_inputs`).
        analysis: ``gm``'s, where the caller has it (else it is computed).
    """
    analysis = analysis_of(gm, analysis)
    through_views, reason = view_write_plan(gm, write_back, analysis)
    if reason is not None:
        return f"a write through a view cannot be made functional: {reason}"
    writable = analysis.written_inputs if write_back else {}
    classes, sources = analysis.classes, analysis.inputs
    inputs = {classes[n] for n in sources}
    members: dict[Any, list[fx.Node]] = {}  # storage class -> its nodes, in the graph's order
    for member, key in classes.items():
        members.setdefault(key, []).append(member)
    for node, target in analysis.mutated.items():
        if node in through_views:
            continue
        what = _describe(node)
        if out_argument(node) is not None:
            return f"{what} writes into an out= tensor"
        if not isinstance(target, fx.Node) or target not in classes:
            return f"{what} writes into a value the graph cannot follow"
        if classes[target] in inputs and node not in writable:
            root = next(n for n in sources if classes[n] == classes[target])
            name = name_of(root) if name_of is not None else str(root.target)
            return f"the graph mutates {name} in place ({what}, directly or through a view)"
        live = _live_alias(node, target, analysis, members.get(classes[target], []))
        if live is not None:
            return f"{what} writes into {target.name}, whose alias {live.name} is read later"
    return None


def _live_alias(
    node: fx.Node, target: fx.Node, analysis: GraphAnalysis, sharing: list[fx.Node]
) -> fx.Node | None:
    """A node of ``sharing`` (those that may share ``target``'s storage) created before
    ``node`` and read after it (the in-place op on ``target`` would change what it reads)."""
    order = analysis.order
    position = order[node]
    same = analysis.roots[target]
    for other in sharing:
        if order.get(other, position + 1) > position:
            continue
        if other is node or analysis.roots[other] is same:
            continue  # the same tensor: functionalize() redirects its later readers
        if any(order.get(user, -1) > position for user in other.users):
            return other
    return None


def output_alias(gm: fx.GraphModule, analysis: GraphAnalysis | None = None) -> str | None:
    """Why ``gm``'s outputs cannot be returned as independent tensors, or None.

    In eager, outputs that are views of one another or of an input share storage, so a write
    into one shows in the other; a runtime that returns fresh tensors would lose that. An
    output that is an input's tensor itself is fine: the caller returns that input
    (:attr:`~embedl_dynamo.graph.analysis.GraphAnalysis.returned_inputs`); so is a view the
    caller regenerates after the call (:func:`~embedl_dynamo.graph.output_views.output_views`),
    the tensor several outputs view included (returned too, hidden: :func:`with_view_bases`).
    ``analysis`` is ``gm``'s, where the caller has it.
    """
    analysis = analysis_of(gm, analysis)
    bases = with_view_bases(gm, analysis)
    if bases is not None:  # the graph is compiled returning the tensors its outputs view
        return output_alias(bases.gm)
    classes = analysis.classes
    inputs = {classes[n] for n in analysis.inputs}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    regenerated = output_views(gm, analysis)
    values = analysis.outputs
    seen: dict[Any, fx.Node] = {}
    for value in _flat_nodes(output.args):
        key = classes.get(value)
        if key is None or not isinstance(value, fx.Node):
            continue
        if any(values[p] is value for p in regenerated):
            continue  # a view of another output or of an input: regenerated after the call
        if analysis.roots[value].op == "placeholder":
            continue  # the input itself: the caller returns it (returned_inputs)
        if value.op in ("placeholder", "get_attr") or key in inputs:
            return f"the graph returns {value.name}, which shares storage with an input"
        if key in seen:
            return f"the graph returns {seen[key].name} and {value.name}, which share storage"
        seen[key] = value
    return None


def _flat_nodes(args: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(args, found.append)
    return found


def _describe(node: fx.Node) -> str:
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    return f"the in-place op {name or node.target} ({node.name})"


def functionalize(
    gm: fx.GraphModule, write_back: bool = False, analysis: GraphAnalysis | None = None
) -> tuple[int, ...]:
    """Make every in-place op of ``gm`` functional, in place.

    With ``write_back``, each placeholder written in place
    (:attr:`~embedl_dynamo.graph.analysis.GraphAnalysis.written_inputs`) gets its final value
    appended to the graph's outputs, in placeholder order. ``analysis`` is ``gm``'s, where the
    caller has it; a step that changes the graph analyses it again for the next.

    Returns:
        The positions, among ``gm``'s placeholders, of the inputs whose final values were
        appended (empty without ``write_back``).

    Raises:
        ValueError: :func:`mutation_blocker` names a reason (check it first).
    """
    analysis = analysis_of(gm, analysis)
    reason = mutation_blocker(gm, write_back=write_back, analysis=analysis)
    if reason is not None:
        raise ValueError(reason)
    changed = _drop_same_tensor_nodes(gm)
    if changed:  # nodes dropped: the graph they left is another state
        analysis = analyze(gm)
    # writes through views first: each becomes a write into a copy of its own and a scatter
    final = functionalize_view_writes(gm, write_back, analysis)  # a placeholder -> its value
    if not analysis.describes(gm):  # writes through views rewritten: analyse the new graph
        analysis = analyze(gm)
    writes = analysis.written_inputs if write_back else {}
    # nodes ``_out_of_place`` adds are ordered just before the node they serve
    order: dict[fx.Node, float] = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        target = mutated_tensor(node)
        if target is None or node.target is operator.setitem:
            continue  # setitem returns None: the write stays, on a tensor nothing else reads
        for user in list(target.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(target, node)
        if node in writes:
            final[writes[node]] = node
        for added in _out_of_place(node):  # just before ``node``: they read what it reads
            order[added] = order[node] - 0.5
        changed = True
    positions = _append_outputs(gm, final)
    if changed or final:
        gm.graph.lint()
        gm.recompile()
    return positions


def _append_outputs(gm: fx.GraphModule, final: dict[fx.Node, fx.Node]) -> tuple[int, ...]:
    """Append ``final``'s values to ``gm``'s (tuple) outputs; their placeholders' positions."""
    if not final:
        return ()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = [p for p in placeholders if p in final]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    output.args = (_output_values(gm) + tuple(final[p] for p in written),)
    return tuple(placeholders.index(p) for p in written)


def _out_of_place(node: fx.Node) -> list[fx.Node]:
    """Turn ``node`` into its out-of-place form where PyTorch has one; else leave the op.

    Returns:
        The nodes added before ``node`` for it (``copy_``'s cast).
    """
    if node.op == "call_method" and node.target == "copy_":
        return _copy_out_of_place(node)
    if node.op == "call_method":
        name = str(node.target)[:-1]
        if hasattr(torch.Tensor, name):
            node.target = name
    elif node.op == "call_function":
        if node.target in INPLACE_OPERATORS:
            node.target = INPLACE_OPERATORS[node.target]
        elif "inplace" in node.kwargs:
            node.kwargs = {**node.kwargs, "inplace": False}
        elif inplace_flag(node):
            return []  # positional flag: the op stays in place, on a tensor nothing else reads
        else:
            plain = getattr(torch, getattr(node.target, "__name__", "")[:-1], None)
            if plain is not None and is_torch_op(node.target):
                node.target = plain
    return []


def _copy_out_of_place(node: fx.Node) -> list[fx.Node]:
    """``x.copy_(src)`` (a sliding-window KV cache's shift) has no out-of-place method: its
    value is ``src`` cast to ``x``'s dtype and broadcast to ``x``'s shape, in memory of its
    own, ``src.type_as(x).expand_as(x).clone()``, which exporters take (``aten::copy`` they do
    not). The clone keeps ``x`` apart from ``src``, as ``copy_`` does: ``type_as`` and
    ``expand_as`` return ``src``'s own memory where nothing changes, and an in-place op left
    on ``src`` (``src.zero_()``, which has no out-of-place form) would then change ``x`` too.
    Returns the nodes added before ``node``."""
    target, source = node.args[0], node.args[1]
    with node.graph.inserting_before(node):
        cast = node.graph.call_method("type_as", (source, target))
        expanded = node.graph.call_method("expand_as", (cast, target))
    node.target, node.args, node.kwargs = "clone", (expanded,), {}
    infer_meta(node.graph.owning_module, [cast, expanded, node])
    return [cast, expanded]
