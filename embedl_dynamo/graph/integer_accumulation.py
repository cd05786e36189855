"""Integer running sums and products in int64, as PyTorch computes them.

PyTorch promotes ``cumsum``/``cumprod`` of a bool or integer tensor without ``dtype=`` to
int64 (``mask.cumsum(-1)`` on an int32 mask is int64), while ONNX's ``CumSum`` keeps its
input's type and the TorchScript exporter adds no cast: the file would return int32, and
overflow where PyTorch does not. :func:`accumulate_integers_in_int64` makes the promotion
explicit in the graph, ``x.cumsum(d)`` -> ``x.to(torch.int64).cumsum(d)``, so every runtime
computes what eager computes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import node_value_meta

__all__ = ["accumulate_integers_in_int64"]

_ACCUMULATIONS = frozenset({"cumsum", "cumprod"})
_PROMOTED = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32})


def _accumulation(node: fx.Node) -> bool:
    """Whether ``node`` is a ``cumsum``/``cumprod`` call (method or function) without dtype."""
    if node.op == "call_method":
        name = str(node.target)
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if getattr(torch, name, None) is not node.target:
            return False
    else:
        return False
    return name in _ACCUMULATIONS and node.kwargs.get("dtype") is None and len(node.args) < 3


def _source(node: fx.Node) -> Any:
    return node.args[0] if node.args else node.kwargs.get("input")


def accumulate_integers_in_int64(gm: fx.GraphModule) -> bool:
    """Cast the integer input of every ``cumsum``/``cumprod`` that PyTorch promotes to int64
    (see the module docstring), in place. Returns whether ``gm`` changed."""
    changed = False
    for node in list(gm.graph.nodes):
        if not _accumulation(node):
            continue
        source = _source(node)
        value = node_value_meta(source) if isinstance(source, fx.Node) else None
        if getattr(value, "dtype", None) not in _PROMOTED:
            continue
        with gm.graph.inserting_before(node):
            cast = gm.graph.call_method("to", (source, torch.int64))
        for key in ("example_value", "val"):
            if isinstance(source.meta.get(key), torch.Tensor):
                cast.meta[key] = source.meta[key].to(torch.int64)
        node.replace_input_with(source, cast)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
