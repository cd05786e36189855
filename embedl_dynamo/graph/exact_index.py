"""The exact form of indexing with several index tensors: each made non-negative first.

PyTorch reads a negative index from the end of the dimension it addresses, ``i + n``. The
TorchScript exporter writes ``x[i, j]`` with two or more index tensors (or int lists) as one
flat index into ``x``, where a negative index lands elsewhere: ``arange(20).view(4, 5)[[-1,
0], [-1, -5]]`` gives ``[14, 15]`` on ONNX Runtime and OpenVINO where PyTorch gives ``[19,
0]``, and the last-token idiom ``h[arange(B), lengths - 1]`` reads another sample's token for
an empty sequence. ``x[i, j] = v`` fails on OpenVINO for the same reason. Here each index that
can be negative becomes ``where(-n <= i < 0, i + n, i)`` first, PyTorch's own reading: every
index PyTorch takes gives PyTorch's element, and one it refuses stays as it was (PyTorch still
raises; :mod:`embedl_dynamo.graph.index_guards` flags it on a runtime). An index the graph
proves non-negative (an ``arange``, a constant) is left alone, as is a lone index tensor, which
the exporter writes as a ``Gather`` on its axis that wraps a negative one as PyTorch does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.index_ops import (
    index_dims,
    index_items,
    is_position_index,
    known_true,
    proven_range,
)
from embedl_dynamo.graph.nodes import node_value_meta

__all__ = ["exact_getitem", "exact_setitem", "index_form"]


def _normalized(x: torch.Tensor, index: Any, nonnegative: Sequence[int]) -> Any:
    """``index`` with each index tensor or int list that may be negative made non-negative,
    where it holds two or more of them; ``index`` itself otherwise."""
    items = index_items(index)
    advanced = [p for p, v in enumerate(items) if isinstance(v, (torch.Tensor, list))]
    if len(advanced) < 2:
        return index
    dims = index_dims(x.dim(), items)
    out = list(items)
    for position in advanced:
        item = items[position]
        if position in nonnegative or not is_position_index(item):
            continue
        i = torch.as_tensor(item, device=x.device) if isinstance(item, list) else item
        shifted = i + x.size(dims[position])
        out[position] = torch.where((i < 0) & (shifted >= 0), shifted, i)  # below -n: as it was
    return tuple(out)


def exact_getitem(x: Any, index: Any, nonnegative: Sequence[int] = ()) -> Any:
    """``x[index]``; with two or more index tensors, each not at a position in
    ``nonnegative`` is made non-negative first (the same elements in PyTorch)."""
    if not isinstance(x, torch.Tensor):
        return x[index]
    return x[_normalized(x, index, nonnegative)]


def exact_setitem(x: Any, index: Any, value: Any, nonnegative: Sequence[int] = ()) -> None:
    """``x[index] = value``, its index made non-negative as :func:`exact_getitem`'s."""
    if not isinstance(x, torch.Tensor):
        x[index] = value
        return
    x[_normalized(x, index, nonnegative)] = value


_FORMS: dict[Any, Callable[..., Any]] = {
    operator.getitem: exact_getitem,
    operator.setitem: exact_setitem,
}


def _may_be_index_tensor(item: Any) -> bool:
    if isinstance(item, list):
        return True
    if not isinstance(item, fx.Node):
        return False
    value = node_value_meta(item)
    return value is None or isinstance(value, torch.Tensor)


def _nonnegative(gm: fx.GraphModule, item: Any) -> bool:
    value = node_value_meta(item) if isinstance(item, fx.Node) else None
    if isinstance(value, torch.Tensor) and not is_position_index(value):
        return True  # a mask: never made non-negative
    proven = proven_range(gm, item)
    return proven is not None and known_true(proven[0] >= 0)


def index_form(
    gm: fx.GraphModule, node: fx.Node
) -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """The exact form of a ``getitem``/``setitem`` node and the keyword arguments to add
    (the positions of the index items the graph proves non-negative); None when the node
    needs none: not indexing, one index tensor, or none that can be negative."""
    if node.op != "call_function" or node.target not in _FORMS or len(node.args) < 2:
        return None
    source = node_value_meta(node.args[0])
    if source is not None and not isinstance(source, torch.Tensor):
        return None  # picking one output of a multi-output op
    items = index_items(node.args[1])
    candidates = [p for p, item in enumerate(items) if _may_be_index_tensor(item)]
    if len(candidates) < 2:
        return None
    nonnegative = tuple(p for p in candidates if _nonnegative(gm, items[p]))
    if len(nonnegative) == len(candidates):
        return None
    return _FORMS[node.target], {"nonnegative": nonnegative}
