"""Decide where QDQ goes, from a target's placement rules: annotation, not insertion.

As in PT2E, deciding is separate from inserting. :func:`plan_placement` runs each
:class:`~embedl_dynamo.quant.int8.rules.PlacementRule` over the fused graph and collects

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

import torch
from torch import fx

from embedl_dynamo.graph.nodes import module_path, node_value_meta
from embedl_dynamo.patterns.fused_modules import ACTIVATIONS
from embedl_dynamo.quant.int8.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.rewrite.match import Match
from embedl_dynamo.rewrite.matcher import find_matches, index_graph, verdict
from embedl_dynamo.rewrite.qdq import QDQ, Role

__all__ = ["LayerPoints", "Placement", "WeightPoint", "apply_preparation", "plan_placement"]


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
class LayerPoints:
    """What one quantized layer asked for: its node, its module (if fused) and its QDQ points."""

    node: str
    module: str = ""
    activations: list[str] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)


@dataclass
class Placement:
    """Where QDQ goes in one graph.

    Attributes:
        activations: node name -> role, for values quantized on the way out of ``node``.
        weights: weight key -> :class:`WeightPoint`.
        float_layers: ``(id, reason)`` for ops a pattern matched but left in float.
        quantized_layers: ids of the matches that were quantized.
        layers: quantized layer id -> its :class:`LayerPoints` (a point two layers share is
            listed under both).
    """

    activations: dict[str, Role] = field(default_factory=dict)
    weights: dict[str, WeightPoint] = field(default_factory=dict)
    float_layers: list[tuple[str, str]] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)
    layers: dict[str, LayerPoints] = field(default_factory=dict)

    def without(self, layers: set[str], reason: str) -> Placement:
        """This placement with ``layers`` moved to float (``reason``): their points are dropped
        unless a layer still quantized needs them too."""
        kept = [i for i in self.quantized_layers if i not in layers]
        activations = {n for i in kept for n in self.layers[i].activations}
        weights = {k for i in kept for k in self.layers[i].weights}
        return Placement(
            activations={n: r for n, r in self.activations.items() if n in activations},
            weights={k: w for k, w in self.weights.items() if k in weights},
            float_layers=[
                *self.float_layers,
                *((i, reason) for i in self.quantized_layers if i in layers),
            ],
            quantized_layers=kept,
            layers={i: self.layers[i] for i in kept},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "activations": {k: v.value for k, v in self.activations.items()},
            "weights": sorted(self.weights),
            "float_layers": [{"id": i, "reason": r} for i, r in self.float_layers],
            "quantized_layers": list(self.quantized_layers),
        }


# Activations an output Q absorbs (its range clips at 0 / 6): the runtime fuses them into the
# integer kernel. A Q after any other activation would leave the layer itself in float.
_CLIPPING_ACTIVATIONS = frozenset(t for t, name in ACTIVATIONS.items() if name in ("relu", "relu6"))


def _past_activation(node: fx.Node) -> fx.Node:
    """The node whose output gets the QDQ: ``node``, or its ReLU/ReLU6 if that is its only
    user (the Q range absorbs the clip, so the integer kernel still forms)."""
    users = list(node.users)
    if (
        len(users) == 1
        and users[0].op == "call_function"
        and users[0].target in _CLIPPING_ACTIVATIONS
    ):
        return users[0]
    return node


def _add_activation(placement: Placement, layer: LayerPoints, value: Any, role: Role) -> None:
    if isinstance(value, fx.Node) and value.op != "get_attr" and _floating(value):
        placement.activations.setdefault(value.name, role)
        layer.activations.append(value.name)


def _floating(node: fx.Node) -> bool:
    """Whether ``node``'s value is floating point (or unknown): an integer or bool tensor has
    no 8-bit form, and a Q/DQ on it fails (PyTorch's fake quantization refuses it)."""
    value = node_value_meta(node)
    return not isinstance(value, torch.Tensor) or value.is_floating_point()


def _add_weight(placement: Placement, layer: LayerPoints, point: WeightPoint) -> None:
    placement.weights.setdefault(point.key, point)
    layer.weights.append(point.key)


def _annotate_match(
    placement: Placement, pattern: PlacementRule, m: Match, layer: LayerPoints
) -> None:
    qdq = pattern.qdq_for(m)
    for name, role in qdq.inputs.items():
        _add_activation(placement, layer, m[name], role)
    for name, role in qdq.weights.items():
        node = m[name]
        if isinstance(node, fx.Node) and node.op == "get_attr":
            _add_weight(
                placement, layer, WeightPoint(str(node.target), role, consumer=m.anchor.name)
            )
    if qdq.output is not None:
        _add_activation(placement, layer, _past_activation(m.anchor), qdq.output)


def _annotate_module(
    placement: Placement, node: fx.Node, qdq: QDQ, output: Role | None, layer: LayerPoints
) -> None:
    for position, role in qdq.inputs.items():
        index = int(position)
        if index < len(node.args):
            _add_activation(placement, layer, node.args[index], role)
    for param, role in qdq.weights.items():
        point = WeightPoint(f"{node.target}.{param}", role, str(node.target), param, node.name)
        _add_weight(placement, layer, point)
    if output is not None and not any(u.target is operator.getitem for u in node.users):
        _add_activation(placement, layer, _past_activation(node), output)


def apply_preparation(gm: fx.GraphModule, rewrites: Sequence[PreparationRewrite]) -> list[str]:
    """Run the preparation rewrites on every fused module call of ``gm``, in place.

    Returns:
        The names of the rewritten nodes.
    """
    rewritten = []
    for rewrite in rewrites:
        modules = dict(gm.named_modules())
        for node in list(gm.graph.nodes):
            if node.op == "call_module" and rewrite.rewrite_module(
                gm, node, modules[str(node.target)]
            ):
                rewritten.append(node.name)
    if rewritten:
        gm.graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return rewritten


def plan_placement(gm: fx.GraphModule, rules: Sequence[PlacementRule]) -> Placement:
    """Annotate ``gm`` with the QDQ positions the placement ``rules`` ask for.

    Args:
        gm: the fused, canonical graph; not modified.
        rules: the target's placement rules, in priority order.

    Returns:
        The :class:`Placement`.
    """
    placement = Placement()
    index = index_graph(gm)
    modules = dict(gm.named_modules())
    claimed: set[str] = set()  # fused-module nodes an earlier rule already decided
    for rule in rules:
        for m in find_matches(rule, gm, index) if rule.matches_functions else []:
            reason = verdict(m)
            if reason:
                placement.float_layers.append((m.id, reason))
                continue
            placement.quantized_layers.append(m.id)
            layer = placement.layers.setdefault(m.id, LayerPoints(m.anchor.name))
            _annotate_match(placement, rule, m, layer)
        if not rule.module_types:
            continue
        for node in gm.graph.nodes:
            if node.op != "call_module" or not isinstance(
                modules.get(node.target), rule.module_types
            ):
                continue
            if node.name in claimed:
                continue
            claimed.add(node.name)
            module = modules[node.target]
            qdq = rule.module_qdq(module, node)
            if qdq.empty and rule.module_output is None:
                continue  # the module asks for no QDQ (LayerNorm stays in high precision)
            ident = f"{rule.name}@{module_path(node) or node.target}"
            reason = rule.check_module(module, node)
            if reason:
                placement.float_layers.append((ident, reason))
                continue
            placement.quantized_layers.append(ident)
            layer = placement.layers.setdefault(ident, LayerPoints(node.name, str(node.target)))
            _annotate_module(placement, node, qdq, rule.module_output, layer)
    dropped = {name for rule in rules for name in rule.refine(placement.activations, gm)}
    for layer in placement.layers.values():
        layer.activations = [a for a in layer.activations if a not in dropped]
    return placement
