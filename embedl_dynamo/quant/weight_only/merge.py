"""Weight-only layers that read the same input, stored as one layer and split after.

A decoder layer multiplies one normalised hidden state by three weights (the query, key and
value projections) and another by two (the MLP's gate and up projections). Each is its own
weight-only matmul: at one token a step, a kernel call per weight, and the key and value
projections (a few hundred output features) are too small to keep two threads busy. Stored
as one ``[N1 + N2 + ..., K]`` weight, they are one call that streams the same bytes, followed
by a split (and each part's own activation).

The numbers do not change: weight-only codes, scales and zero points are per output feature
(and per group of input features for 4 bits), so the merged layer holds exactly the rows of
its parts, and each output feature is the same dot product. Layers merge only where they
agree in everything stored per layer: bits, group size, symmetry, dtype, input features and
whether they have a bias; the accuracy budget's per-layer choice of bits comes first, so a
layer it kept at 8 bits stays apart from 4-bit siblings. ONNX Runtime's ``MatMulNBits`` and
OpenVINO's compressed ``FullyConnected`` (which merges such siblings by itself) run the merged
weight as one kernel.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import module_path
from embedl_dynamo.quant.weight_only.linear import WeightOnlyLinear, apply_activation

__all__ = ["MergedWeightOnlyLinear", "merge_sibling_layers"]


class MergedWeightOnlyLinear(WeightOnlyLinear):
    """Weight-only layers of one input stored as one: ``x @ [W1; W2; ...].T + [b1; b2; ...]``,
    split into the parts' outputs, each through its own activation. ``forward`` returns the
    parts as a tuple."""

    def __init__(self, layers: list[WeightOnlyLinear]) -> None:
        first = layers[0]
        zero = None if first.zero_point is None else torch.cat([m.zero_point for m in layers])
        bias = None if first.bias is None else torch.cat([m.bias for m in layers])
        super().__init__(
            torch.cat([m.codes for m in layers]),
            torch.cat([m.scale for m in layers]),
            zero,
            bias,
            first.spec,
            kind="+".join(dict.fromkeys(m.kind for m in layers)),
            activation=None,
            dtype=first.dtype,
        )
        self.sizes = [m.codes.shape[0] for m in layers]
        self.activations = [m.activation for m in layers]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        parts = super().forward(x).split(self.sizes, dim=-1)
        return tuple(apply_activation(a, p) for a, p in zip(self.activations, parts))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, parts={self.sizes}"


def _form(layer: WeightOnlyLinear) -> tuple[Any, ...]:
    """What must agree for layers to be stored as one (the spec also fixes the codes' dtype
    and whether there are zero points)."""
    return (layer.spec, layer.dtype, layer.codes.shape[1], layer.bias is None)


def _sibling_groups(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """Weight-only layer calls of one input node and one :func:`_form`, two or more, in
    graph order."""
    groups: dict[tuple[Any, ...], list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        layer = gm.get_submodule(str(node.target))
        source = node.args[0]
        if type(layer) is WeightOnlyLinear and isinstance(source, fx.Node):
            groups.setdefault((source, *_form(layer)), []).append(node)
    return [nodes for nodes in groups.values() if len(nodes) > 1]


def merge_sibling_layers(gm: fx.GraphModule) -> list[list[str]]:
    """Store each group of weight-only layers that read the same input as one
    :class:`MergedWeightOnlyLinear` (in place; see the module).

    Returns:
        The merged groups, each as its layers' ids (``kind@module.path``).
    """
    merged = []
    for nodes in _sibling_groups(gm):
        layers = [gm.get_submodule(str(n.target)) for n in nodes]
        name = f"{nodes[0].target}_merged"
        while hasattr(gm, name):
            name += "_"
        gm.add_submodule(name, MergedWeightOnlyLinear(layers))
        with gm.graph.inserting_before(nodes[0]):
            call = gm.graph.call_module(name, nodes[0].args)
            for index, node in enumerate(nodes):
                part = gm.graph.call_function(operator.getitem, (call, index))
                part.meta = dict(node.meta)
                node.replace_all_uses_with(part)
        merged.append(
            [f"{layer.kind}@{module_path(n) or n.name}" for n, layer in zip(nodes, layers)]
        )
        for node in nodes:
            gm.graph.erase_node(node)
            gm.delete_submodule(str(node.target))
    if merged:
        gm.graph.lint()
        gm.recompile()
    return merged
