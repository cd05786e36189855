"""Where a graph's ops index a tensor, and the range of indices PyTorch accepts there.

PyTorch raises for an index outside an op's range; ONNX's ``Gather``, ``GatherElements`` and
``ScatterElements`` wrap a negative one, ONNX Runtime raises for one past the end and OpenVINO
returns zeros. Each :class:`IndexUse` is one index of one op, the dimension of the indexed
tensor it addresses and whether PyTorch takes negatives there (n is that dimension's size):

* ``x[i]``, ``x[i] = v`` (``getitem``/``setitem``, one use per index tensor or int list),
  ``index_put``, ``index_fill``: [-n, n); ``take``: [-n, n) over the element count;
* ``embedding`` (n = the table's rows), ``gather``, ``scatter``, ``scatter_add``,
  ``scatter_reduce``, ``index_select``, ``index_add``, ``index_copy``: [0, n).

:func:`proven_range` is what the graph proves of an index's values, [lo, hi): a ``get_attr``
constant's or an int list's min and max + 1, ``arange(start, end, step > 0)``'s [start, end),
and the same through ops that only move or pick values (``unsqueeze``, ``expand``, indexing).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from embedl_dynamo.graph.nodes import constant_value, looked_up, node_value_meta

__all__ = [
    "IndexUse",
    "index_dims",
    "index_items",
    "index_uses",
    "int_list",
    "is_position_index",
    "known_true",
    "proven_range",
    "size_of",
    "tensor_size",
]

_MASKS = (torch.bool, torch.uint8)  # index tensors PyTorch reads as masks, not positions
_WITH_DIM = ("input", "dim", "index")
# op name -> (parameter names, indexed tensor, index, dim (a parameter, a fixed dim or None:
# the element count), negatives taken)
_SPECS: dict[str, tuple[tuple[str, ...], str, str, str | int | None, bool]] = {
    "embedding": (("input", "weight"), "weight", "input", 0, False),
    "torch.embedding": (("weight", "input"), "weight", "input", 0, False),
    "take": (("input", "index"), "input", "index", None, True),
    "index_fill": (_WITH_DIM, "input", "index", "dim", True),
    **{
        name: (_WITH_DIM, "input", "index", "dim", False)
        for name in (
            "gather",
            "scatter",
            "scatter_add",
            "scatter_reduce",
            "index_select",
            "index_add",
            "index_copy",
        )
    },
}
_ITEMS = ("getitem", "setitem", "index_put")  # ops whose index is a tuple of items
_FUNCTIONS: dict[Any, str] = {
    F.embedding: "embedding",
    torch.embedding: "torch.embedding",
    torch.index_put: "index_put",
    operator.getitem: "getitem",
    operator.setitem: "setitem",
    **{getattr(torch, name): name for name in _SPECS if "embedding" not in name},
}
_METHODS = frozenset({*_SPECS, "index_put"} - {"embedding", "torch.embedding"})
# ops whose values are some of their first input's (moved, repeated or picked)
_MOVES = frozenset(
    {
        "unsqueeze",
        "squeeze",
        "view",
        "reshape",
        "expand",
        "expand_as",
        "flatten",
        "contiguous",
        "clone",
        "long",
        "repeat",
        "t",
        "transpose",
        "permute",
        "getitem",
    }
)


@dataclass(frozen=True)
class IndexUse:
    """One index of one op.

    Attributes:
        node: the op.
        op: its name (``getitem``, ``embedding``, ``gather``...).
        index: the index: a tensor node, or a list of ints (a constant).
        tensor: the indexed tensor.
        dim: the dimension of ``tensor`` it addresses; None: the element count (``take``).
        negatives: whether PyTorch takes [-n, 0) there too.
    """

    node: fx.Node
    op: str
    index: fx.Node | list
    tensor: fx.Node
    dim: int | None
    negatives: bool


def known_true(condition: Any) -> bool:
    """Whether ``condition`` (a bool, or a SymBool over sizes) holds for every size the graph
    may see; asks Dynamo for no guard."""
    return bool(statically_known_true(condition))


def int_list(value: Any) -> bool:
    """Whether ``value`` is a (nested) list of Python ints, not bools: one index tensor."""
    if not isinstance(value, list):
        return False
    return all(int_list(v) if isinstance(v, list) else type(v) is int for v in value)


def index_items(index: Any) -> tuple[Any, ...]:
    """``x[index]``'s index as the tuple of items PyTorch reads: a list of ints (or of bools)
    is one item, any other list a tuple (PyTorch's rule for a list holding a tensor, a list,
    a slice, ``None`` or ``...``)."""
    if isinstance(index, tuple):
        return index
    if isinstance(index, list) and not all(type(v) in (int, bool) for v in index):
        return tuple(index)
    return (index,)


def _rank(value: Any) -> int:
    """How many dimensions of the indexed tensor an index item consumes."""
    if value is None or value is ...:
        return 0
    if isinstance(value, torch.Tensor) and value.dtype in _MASKS:
        return value.dim()
    if isinstance(value, list) and not int_list(value):
        return torch.as_tensor(value).dim()  # a list of bools: a mask
    return 1


def index_dims(ndim: int, values: Sequence[Any]) -> list[int | None]:
    """The first dimension of an ``ndim``-d tensor each index item addresses (None: ``None``
    and ``...``), from the items' values (tensors, fake tensors, numbers, slices, lists)."""
    ranks = [_rank(v) for v in values]
    dims: list[int | None] = []
    dim = 0
    for value, rank in zip(values, ranks):
        if value is ...:
            dim += ndim - sum(ranks)
        dims.append(dim if rank else None)
        dim += rank
    return dims


def is_position_index(value: Any) -> bool:
    """Whether an index item's value is an integer index tensor or a list of ints."""
    if isinstance(value, torch.Tensor):
        return value.dtype not in _MASKS and not value.is_floating_point()
    return int_list(value)


def _op_name(node: fx.Node) -> str | None:
    if node.op == "call_method":
        name = str(node.target).removesuffix("_")  # an in-place form reads the same indices
        return name if name in _METHODS else None
    return looked_up(_FUNCTIONS, node.target) if node.op == "call_function" else None


def _item_uses(node: fx.Node, op: str) -> list[IndexUse]:
    """The index tensors and int lists of a ``getitem``/``setitem``/``index_put`` and the
    dimensions they address; raises LookupError when shape metadata is missing."""
    if op == "index_put":
        bound = {**dict(zip(("input", "indices"), node.args)), **node.kwargs}
        tensor, items = bound.get("input"), tuple(bound.get("indices") or ())
    else:
        tensor, items = node.args[0], index_items(node.args[1])
    meta = node_value_meta(tensor)
    if meta is not None and not isinstance(meta, torch.Tensor):
        return []  # picking one output of a multi-output op, or an item of a list
    if not any(isinstance(i, (fx.Node, list)) for i in items):
        return []  # numbers and slices only: no index tensor
    values = [node_value_meta(v) if isinstance(v, fx.Node) else v for v in items]
    if meta is None or any(v is None and i is not None for v, i in zip(values, items)):
        raise LookupError("no shape metadata on the indexed tensor or an index")
    dims = index_dims(meta.dim(), values) if op != "index_put" else list(range(len(values)))
    return [
        IndexUse(node, op, item, tensor, dim, True)
        for item, value, dim in zip(items, values, dims)
        if dim is not None and is_position_index(value)
    ]


def _spec_use(node: fx.Node, op: str) -> IndexUse | None:
    names, tensor_name, index_name, dim_name, negatives = _SPECS[op]
    bound = {**dict(zip(names, node.args)), **node.kwargs}
    tensor, index = bound.get(tensor_name), bound.get(index_name)
    dim = bound.get(dim_name) if isinstance(dim_name, str) else dim_name
    if not isinstance(index, fx.Node) or not isinstance(tensor, fx.Node):
        return None
    if isinstance(dim, int) and dim < 0:
        dim += max(getattr(node_value_meta(tensor), "ndim", 1), 1)
    return IndexUse(node, op.removeprefix("torch."), index, tensor, dim, negatives)


def index_uses(gm: fx.GraphModule) -> tuple[list[IndexUse], list[tuple[fx.Node, str]]]:
    """Every index of every index op in ``gm``, in graph order.

    Returns:
        The uses, and the index ops whose indices cannot be told (no shape metadata), each
        with the reason.
    """
    uses: list[IndexUse] = []
    unknown: list[tuple[fx.Node, str]] = []
    for node in gm.graph.nodes:
        op = _op_name(node)
        if op in _ITEMS:
            try:
                uses.extend(_item_uses(node, op))
            except LookupError as error:
                unknown.append((node, str(error)))
        elif op is not None:
            use = _spec_use(node, op)
            if use is not None:
                uses.append(use)
    return uses, unknown


def _number(value: Any) -> Any:
    """A literal int, or the int/SymInt a size node computes; None for anything else."""
    if isinstance(value, fx.Node):
        value = node_value_meta(value)
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        return None
    return value


def _arange_range(node: fx.Node) -> tuple[Any, Any, str] | None:
    names = ("start", "end", "step") if len(node.args) > 1 else ("end",)
    bound = {"start": 0, "step": 1, **dict(zip(names, node.args)), **node.kwargs}
    start, end, step = (_number(bound.get(name)) for name in ("start", "end", "step"))
    if start is None or end is None or step is None or not known_true(step > 0):
        return None
    return start, end, "an arange"


def proven_range(gm: fx.GraphModule, index: Any) -> tuple[Any, Any, str] | None:
    """[lo, hi) proven for the values of an integer index (ints or SymInts), with what proves
    it (``a constant``, ``an arange``); None when the graph proves nothing."""
    if int_list(index):
        flat = torch.tensor(index, dtype=torch.int64).flatten().tolist()
        return (min(flat), max(flat) + 1, "a constant") if flat else (0, 0, "a constant")
    if not isinstance(index, fx.Node):
        return None
    value = constant_value(gm, index)
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.dtype in _MASKS:
            return None
        if not value.numel():
            return 0, 0, "a constant"
        return int(value.min()), int(value.max()) + 1, "a constant"
    if index.op == "call_function" and index.target is torch.arange:
        return _arange_range(index)
    name = index.target if index.op == "call_method" else getattr(index.target, "__name__", "")
    if index.op in ("call_method", "call_function") and name in _MOVES and index.args:
        if any(isinstance(a, torch.dtype) for a in (*index.args, *index.kwargs.values())):
            return None  # view(dtype) reads the bits as another type
        source = index.args[0]
        if (
            isinstance(node_value_meta(source), torch.Tensor)
            or constant_value(gm, source) is not None
        ):
            return proven_range(gm, source)
    return None


def size_of(gm: fx.GraphModule, tensor: fx.Node, dim: int | None) -> Any:
    """The int or SymInt size of ``tensor``'s ``dim`` (None: its element count), or None."""
    value = node_value_meta(tensor)
    if value is None:
        value = constant_value(gm, tensor)
    if not isinstance(value, torch.Tensor):
        return None
    return tensor_size(value, dim)


def tensor_size(value: torch.Tensor, dim: int | None) -> Any:
    """``value``'s size along ``dim`` as an index op reads it (None: the element count): a
    0-d tensor is one element along its only dimension, 0 (``gather``, ``scatter`` and the
    ``index_*`` ops take it, with indices in [0, 1)), where ``value.shape[0]`` has none."""
    if dim is None:
        return value.numel()
    return 1 if value.dim() == 0 else value.shape[dim]
