"""Decide where QDQ goes, from the Backend's ``quantized_patterns``: annotation, not insertion.

As in PT2E, deciding is separate from inserting. :func:`plan_placement` runs each placement
pattern (:mod:`embedl_dynamo.patterns.quantized`) over the fused graph and collects

* activation points: graph values quantized once for all their users (``Role.ACTIVATION`` /
  ``Role.OUTPUT``); an output point after a conv whose only user is its activation moves past
  the activation (nothing between conv and relu);
* weight points: constant weights (``get_attr`` nodes, or a fused module's parameter) quantized
  per channel with scales computed from the weights;
* layers left in float, with the reason the pattern's ``check`` gave.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from embedl_dynamo.graph.nodes import module_path
from embedl_dynamo.patterns.fused_modules import ACTIVATIONS
from embedl_dynamo.rewrite.matcher import escaping_node, find_matches, index_graph
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import FusedModule, Role

__all__ = ["Placement", "WeightPoint", "plan_placement", "apply_quantized_rewrites"]


@dataclass(frozen=True)
class WeightPoint:
    """A constant weight to quantize: a ``get_attr`` target, or ``module`` + ``param``."""

    target: str
    role: Role
    module: str = ""
    param: str = ""
    consumer: str = ""

    @property
    def key(self) -> str:
        return f"{self.module}.{self.param}" if self.module else self.target


@dataclass
class Placement:
    """Where QDQ goes in one graph.

    Attributes:
        activations: node name -> role, for values quantized on the way out of ``node``.
        weights: weight key -> :class:`WeightPoint`.
        float_layers: ``(id, reason)`` for ops a pattern matched but left in float.
        quantized_layers: ids of the matches that were quantized.
    """

    activations: dict[str, Role] = field(default_factory=dict)
    weights: dict[str, WeightPoint] = field(default_factory=dict)
    float_layers: list[tuple[str, str]] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "activations": {k: v.value for k, v in self.activations.items()},
            "weights": sorted(self.weights),
            "float_layers": [{"id": i, "reason": r} for i, r in self.float_layers],
            "quantized_layers": list(self.quantized_layers),
        }


def _past_activation(node: fx.Node) -> fx.Node:
    """The node whose output gets the QDQ: ``node``, or its activation if that is its only user."""
    users = list(node.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target in ACTIVATIONS:
        return users[0]
    return node


def _add_activation(placement: Placement, value: Any, role: Role) -> None:
    if isinstance(value, fx.Node) and value.op != "get_attr":
        placement.activations.setdefault(value.name, role)


def _annotate_match(placement: Placement, pattern: Pattern, m: Any) -> None:
    for name, role in pattern.qdq.inputs.items():
        _add_activation(placement, m[name], role)
    for name, role in pattern.qdq.weights.items():
        node = m[name]
        if isinstance(node, fx.Node) and node.op == "get_attr":
            point = WeightPoint(str(node.target), role, consumer=m.anchor.name)
            placement.weights.setdefault(point.key, point)
    if pattern.qdq.output is not None:
        _add_activation(placement, _past_activation(m.anchor), pattern.qdq.output)


def _annotate_module(
    placement: Placement, node: fx.Node, module: FusedModule, output: Role | None
) -> None:
    for position, role in module.qdq.inputs.items():
        index = int(position)
        if index < len(node.args):
            _add_activation(placement, node.args[index], role)
    for param, role in module.qdq.weights.items():
        point = WeightPoint(f"{node.target}.{param}", role, str(node.target), param, node.name)
        placement.weights.setdefault(point.key, point)
    if output is not None and not any(u.target is operator.getitem for u in node.users):
        _add_activation(placement, _past_activation(node), output)


def apply_quantized_rewrites(gm: fx.GraphModule, patterns: Sequence[Pattern]) -> list[str]:
    """Run the placement patterns' module rewrites (``rewrite_module``) on ``gm`` in place.

    Returns:
        The names of the rewritten nodes.
    """
    rewritten = []
    for pattern in patterns:
        hook = getattr(pattern, "rewrite_module", None)
        if hook is None:
            continue
        modules = dict(gm.named_modules())
        for node in list(gm.graph.nodes):
            if node.op == "call_module" and hook(gm, node, modules.get(str(node.target))):
                rewritten.append(node.name)
    if rewritten:
        gm.graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return rewritten


def plan_placement(gm: fx.GraphModule, patterns: Sequence[Pattern]) -> Placement:
    """Annotate ``gm`` with the QDQ positions the placement ``patterns`` ask for.

    Args:
        gm: the fused, canonical graph; not modified.
        patterns: the Backend's ``quantized_patterns`` (phase ``quantized``).

    Returns:
        The :class:`Placement`.
    """
    placement = Placement()
    index = index_graph(gm)
    modules = dict(gm.named_modules())
    claimed: set[str] = set()  # fused-module nodes an earlier pattern already decided
    for pattern in patterns:
        if pattern.phase != "quantized":
            raise ValueError(
                f"pattern {pattern.name!r} has phase {pattern.phase!r}, not 'quantized'"
            )
        matches = (
            find_matches(pattern, gm, index) if getattr(pattern, "match_functions", True) else []
        )
        for m in matches:
            escaping = escaping_node(m)
            verdict = pattern.check(m)
            if escaping is not None or not verdict.ok:
                reason = verdict.reason if not verdict.ok else f"{escaping.name} escapes"
                placement.float_layers.append((m.id, reason))
                continue
            placement.quantized_layers.append(m.id)
            _annotate_match(placement, pattern, m)
        types = getattr(pattern, "module_types", ())
        if not types:
            continue
        for node in gm.graph.nodes:
            if node.op != "call_module" or not isinstance(modules.get(node.target), types):
                continue
            if node.name in claimed:
                continue
            claimed.add(node.name)
            module = modules[node.target]
            if module.qdq.empty and getattr(pattern, "module_output", None) is None:
                continue  # the module asks for no QDQ (LayerNorm stays in high precision)
            ident = f"{pattern.name}@{module_path(node) or node.target}"
            ok, reason = pattern.check_module(module, node)
            if not ok:
                placement.float_layers.append((ident, reason))
                continue
            placement.quantized_layers.append(ident)
            _annotate_module(placement, node, module, getattr(pattern, "module_output", None))
    return placement
