"""Find a pattern's target subgraph in a canonical graph.

The target function is traced once with ``torch.fx.symbolic_trace`` and canonicalised, so its
nodes use the same targets and keyword names as the graphs it is matched against. Matching
starts at the pattern's output (the *anchor*) and walks the inputs backwards:

* a pattern argument (placeholder) binds to whatever value is there (node or literal), and the
  same argument used twice must bind to the same value;
* a pattern operation matches a node with the same canonical target, input by input; literal
  arguments in the pattern are wildcards (``check`` validates them);
* commutative ops (``add``, ``mul``) are tried with both input orders; when both orders match,
  the first binding that can be rewritten (no escaping value, ``check`` passing) wins.

A found subgraph whose intermediate values are also read outside it cannot be replaced without
losing them; :func:`escaping_node` reports that as the reason to skip.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import fx

from embedl_dynamo.graph.canonical_ops import COMMUTATIVE
from embedl_dynamo.graph.canonicalize import canonicalize
from embedl_dynamo.rewrite.match import Match, Rule

__all__ = [
    "CompiledPattern",
    "TracedRule",
    "compile_target",
    "escaping_node",
    "find_matches",
    "index_graph",
    "match_at",
    "verdict",
]


@dataclass
class CompiledPattern:
    """A pattern target traced to a canonical graph."""

    graph: fx.Graph
    anchor: fx.Node
    names: dict[str, fx.Node]  # match name -> pattern node (ops and placeholders)
    size: int

    @property
    def anchor_key(self) -> tuple[str, Any]:
        return self.anchor.op, self.anchor.target


class TracedRule(Rule, Protocol):
    """A :class:`~.match.Rule` the matcher can search for (:class:`~.pattern.MatchRule` is one)."""

    def compiled(self) -> CompiledPattern:
        """The rule's target traced to a canonical graph (see :func:`compile_target`)."""
        ...


@functools.cache
def compile_target(target: Callable[..., Any]) -> CompiledPattern:
    """Trace a pattern's ``target`` function and canonicalise it.

    Cached per function: a pattern class's static ``target`` is traced once for the class, and
    a parametrised pattern's ``target`` (built per instance) once per instance.
    """
    gm = fx.symbolic_trace(target)
    canonicalize(gm)
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    result = output.args[0]
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
        raise TypeError(
            f"{target.__qualname__} must return (output, {{name: node}}), got {result!r}"
        )
    anchor, named = result
    names: dict[str, fx.Node] = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    names.update(named)
    size = sum(1 for n in graph.nodes if n.op in ("call_function", "call_module", "call_method"))
    return CompiledPattern(graph=graph, anchor=anchor, names=names, size=size)


def _inputs(node: fx.Node) -> list[tuple[Any, Any]]:
    """Inputs as (position or keyword, value): canonical nodes use keywords only, while ops
    outside the canonical set (``operator.getitem``) keep their positional arguments."""
    return list(enumerate(node.args)) + list(node.kwargs.items())


def _graph_input(node: fx.Node, key: Any) -> tuple[bool, Any]:
    if isinstance(key, int):
        return (key < len(node.args), node.args[key] if key < len(node.args) else None)
    return (key in node.kwargs, node.kwargs.get(key))


def _match_node(
    p: Any, g: Any, bindings: dict[fx.Node, Any], node_map: dict[fx.Node, fx.Node]
) -> list[tuple[dict, dict]]:
    """All ways pattern value ``p`` matches graph value ``g``; each is (bindings, node_map)."""
    if isinstance(p, fx.Node) and p.op == "placeholder":
        if p in bindings:
            same = bindings[p] is g or (
                not isinstance(g, fx.Node)
                and not isinstance(bindings[p], fx.Node)
                and bindings[p] == g
            )
            return [(bindings, node_map)] if same else []
        return [({**bindings, p: g}, node_map)]
    if not isinstance(p, fx.Node):
        return [(bindings, node_map)]  # literal in the pattern: a wildcard
    if not isinstance(g, fx.Node) or g.op != p.op or g.target != p.target:
        return []
    if p in node_map:
        return [(bindings, node_map)] if node_map[p] is g else []
    if g in node_map.values():
        return []
    node_map = {**node_map, p: g}
    orders = [_inputs(p)]
    swap = COMMUTATIVE.get(p.target) if p.op == "call_function" else None
    if swap is not None:
        a, b = swap
        swapped = {**p.kwargs, a: p.kwargs[b], b: p.kwargs[a]}
        orders.append(list(swapped.items()))
    results: list[tuple[dict, dict]] = []
    for order in orders:
        states = [(bindings, node_map)]
        for name, p_value in order:
            present, g_value = _graph_input(g, name)
            if not present and isinstance(p_value, fx.Node):
                states = []
                break
            if isinstance(p_value, (list, tuple)):
                continue  # literal lists (shapes, strides) are wildcards
            states = [s for b, nm in states for s in _match_node(p_value, g_value, b, nm)]
            if not states:
                break
        results.extend(states)
    return results


def match_at(pattern: TracedRule, gm: fx.GraphModule, node: fx.Node) -> Match | None:
    """Match ``pattern`` with its anchor at ``node``; the first consistent binding, or None."""
    compiled = pattern.compiled()
    states = _match_node(compiled.anchor, node, {}, {})
    if not states:
        return None
    matches = []
    for bindings, node_map in states:
        named: dict[str, Any] = {}
        for name, p_node in compiled.names.items():
            if p_node.op == "placeholder":
                named[name] = bindings.get(p_node)
            elif p_node in node_map:
                named[name] = node_map[p_node]
        matches.append(Match(pattern, gm, node, named, node_map))
    if len(matches) == 1:
        return matches[0]
    # Several bindings (commutative inputs): ``bn + r`` where ``r`` is itself a BatchNorm output
    # binds either way. Prefer one that can be rewritten: no escaping value, check passing.
    clean = [m for m in matches if escaping_node(m) is None]
    valid = [m for m in clean if not verdict(m)]
    return (valid or clean or matches)[0]


def escaping_node(m: Match) -> fx.Node | None:
    """An intermediate node of ``m`` that is also used outside the match, or None."""
    matched = set(m.node_map.values())
    for node in matched:
        if node is m.anchor:
            continue
        if any(user not in matched for user in node.users):
            return node
    return None


def verdict(m: Match) -> str:
    """Why ``m`` may not be rewritten (an escaping intermediate value, or its pattern's check),
    or ``""`` when it may. The one verdict every phase uses, so reasons read the same."""
    escaping = escaping_node(m)
    if escaping is not None:
        return f"intermediate value {escaping.name} is used outside the match"
    result = m.pattern.check(m)
    return "" if result.ok else (result.reason or "check failed")


def find_matches(pattern: TracedRule, gm: fx.GraphModule, index: dict | None = None) -> list[Match]:
    """Every place ``pattern`` matches in ``gm``, in graph order (matches may overlap)."""
    compiled = pattern.compiled()
    op, target = compiled.anchor_key
    if index is not None:
        candidates = index.get((op, target), [])
    else:
        candidates = [n for n in gm.graph.nodes if n.op == op and n.target == target]
    found = []
    for node in candidates:
        m = match_at(pattern, gm, node)
        if m is not None:
            found.append(m)
    return found


def index_graph(gm: fx.GraphModule) -> dict[tuple[str, Any], list[fx.Node]]:
    """Nodes grouped by (op, target), so each pattern only tries plausible anchors."""
    index: dict[tuple[str, Any], list[fx.Node]] = {}
    for node in gm.graph.nodes:
        index.setdefault((node.op, node.target), []).append(node)
    return index
