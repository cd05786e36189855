"""Bounds on the integers a graph computes, to prove that an int64 sum fits int32.

OpenVINO's CPU plugin computes int64 as int32. Its per-call guard keeps every int64 input,
and every dimension of an input, within [-2**30, 2**30) (``runtimes/openvino/int_range.py``),
so the sum of two inputs still fits; a longer chain of sums, or a sum with a large constant,
may not. The judge names an int64 ``add``/``sub`` whose result this module cannot bound within
int32 ``add(int64 past int32)``, a row of its own that stays in PyTorch on OpenVINO.

A range is the interval ``(low, high)`` that holds a node's values, given the guard on the
graph's inputs; None where the graph proves none. The walk is conservative: an op it does not
know gives no range (unless its dtype does).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import constant_value, node_value_meta

__all__ = [
    "GUARDED_RANGE",
    "INT32_RANGE",
    "computed_within_int32",
    "exact_in_float32",
    "fits_int32",
    "inside",
    "value_range",
]

Range = tuple[int, int]

#: the values OpenVINO's guard lets an int64 input, or an input's dimension, take
GUARDED_RANGE: Range = (-(2**30), 2**30 - 1)
INT32_RANGE: Range = (-(2**31), 2**31 - 1)
#: the largest magnitude up to which float32 holds every integer
FLOAT32_EXACT = 2**24
#: how far back through the graph a range is sought before giving up
_DEPTH = 64

_DTYPE_RANGES: dict[torch.dtype, Range] = {
    torch.bool: (0, 1),
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: INT32_RANGE,
}
#: ops whose values are some of their first input's values
_PASSTHROUGH = frozenset(
    """
    clone contiguous detach view reshape expand expand_as unsqueeze squeeze flatten permute
    transpose t getitem index_select gather take repeat flip roll narrow select movedim
    unflatten to long int type type_as masked_select unbind split chunk diagonal
    """.split()
)
#: ops whose values are some of their arguments' values (a mask's or a condition's are 0 or 1)
_CHOOSERS = frozenset(
    """
    cat stack where maximum minimum masked_fill masked_fill_ tril triu
    """.split()
)
#: clamps: name -> the keywords of its positional bounds
_CLAMPS = {
    "clamp": ("min", "max"),
    "clip": ("min", "max"),
    "clamp_min": ("min",),
    "clamp_max": ("max",),
}
_ADDS = frozenset("add add_ iadd __add__ __radd__".split())
_SUBS = frozenset("sub sub_ isub __sub__".split())
_MULS = frozenset("mul mul_ imul __mul__ __rmul__".split())
#: ops filling a tensor with one value: name -> the value's position
_FILLS = {"full": 1, "full_like": 1, "new_full": 2, "fill_": 1}
_CONSTANT_FILLS = frozenset("zeros zeros_like new_zeros ones ones_like new_ones".split())


def inside(found: Range | None, bounds: Range) -> bool:
    """Whether the range ``found`` is known and lies within ``bounds``."""
    return found is not None and bounds[0] <= found[0] and found[1] <= bounds[1]


def fits_int32(node: fx.Node) -> bool:
    """Whether ``node``'s values provably stay within int32's range."""
    return inside(value_range(node), INT32_RANGE)


def computed_within_int32(node: fx.Node) -> bool:
    """Whether ``node``'s values, those of every integer tensor it reads and every integer it
    is given (a clamp's bound) provably stay within int32's range: OpenVINO, which computes
    int64 as int32, then computes it exactly."""
    given = [a for a in (*node.args, *node.kwargs.values()) if type(a) is int]
    operands = [a for a in node.all_input_nodes if _integer_tensor(a)]
    within = all(inside(value_range(a), INT32_RANGE) for a in given)
    return within and fits_int32(node) and all(fits_int32(a) for a in operands)


def _tensor_node(value: Any) -> bool:
    """Whether ``value`` is a node holding a tensor (``torch.max(x, 1)`` takes a dim there)."""
    return isinstance(value, fx.Node) and isinstance(node_value_meta(value), torch.Tensor)


def _integer_tensor(node: fx.Node) -> bool:
    dtype = getattr(node_value_meta(node), "dtype", None)
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def exact_in_float32(node: fx.Node) -> bool:
    """Whether every operand of ``node`` is an integer (a number, or a tensor of an integer or
    bool dtype) and one of them provably lies strictly within (-2**24, 2**24): a comparison
    OpenVINO computes through float32 is then exact. Float32 holds that operand exactly, and
    rounds every other integer monotonically onto a value that is itself, or lies at or past
    2**24 on its side: never onto the small one, never across it."""
    operands = [a for a in (*node.args, *node.kwargs.values()) if a is not None]
    small = (-FLOAT32_EXACT + 1, FLOAT32_EXACT - 1)
    return (
        bool(operands)
        and all(_integer_operand(a) for a in operands)
        and any(inside(value_range(a), small) for a in operands)
    )


def _integer_operand(value: Any) -> bool:
    if isinstance(value, (bool, int)):
        return True
    return isinstance(value, fx.Node) and _integer_tensor(value)


def value_range(value: Any, depth: int = 0) -> Range | None:
    """The interval holding ``value``'s values (a node, a number, or a list of them); None
    where the graph proves none."""
    if isinstance(value, (bool, int)):
        return int(value), int(value)
    if isinstance(value, (list, tuple)):
        return _hull(value_range(v, depth) for v in value)
    if not isinstance(value, fx.Node) or depth > _DEPTH:
        return None
    meta = node_value_meta(value)
    if getattr(meta, "dtype", None) is not None and meta.dtype.is_floating_point:
        return None  # a float's values are no integer range
    computed = _computed_range(value, depth + 1)
    by_dtype = _DTYPE_RANGES.get(getattr(meta, "dtype", None))
    if by_dtype is None or inside(computed, by_dtype):
        return computed
    return by_dtype  # a narrower integer type wraps a value past its range: any of its values


def _computed_range(node: fx.Node, depth: int) -> Range | None:
    meta = node_value_meta(node)
    if isinstance(meta, torch.SymInt) or isinstance(meta, int) and not isinstance(meta, bool):
        return _size_range(meta)
    if node.op == "placeholder":
        return GUARDED_RANGE if getattr(meta, "dtype", None) == torch.int64 else None
    if node.op == "get_attr":
        return _constant_range(constant_value(node.graph.owning_module, node))
    if node.op not in ("call_function", "call_method"):
        return None
    return _op_range(node, _name(node), depth)


def _op_range(node: fx.Node, name: str, depth: int) -> Range | None:
    args = node.args
    if name in _ADDS | _SUBS | _MULS | {"rsub", "__rsub__"}:
        return _arithmetic_range(node, name, depth)
    if name in ("neg", "__neg__", "abs", "__abs__", "sign") and args:
        return _sign_range(value_range(args[0], depth), name)
    if name in _CLAMPS and args:
        return _clamp_range(node, name, depth)
    if name in ("min", "max") and len(args) == 2 and _tensor_node(args[1]):
        return _hull(value_range(a, depth) for a in args)  # torch.min(a, b): a or b, each place
    if name in ("cumsum", "sum") and args:
        return _sum_range(node, name, depth)
    if name == "arange":  # from start (0 by default) towards end
        return _hull([(0, 0), *(value_range(a, depth) for a in args[:2])])
    if name in _PASSTHROUGH and args:
        if name == "view" and any(isinstance(a, torch.dtype) for a in args[1:]):
            return None  # view(dtype) reads the bits as another type
        return value_range(args[0], depth)
    if name == "where" and len(args) == 1:
        return None  # torch.where(condition): the indices where it holds
    if name in _CHOOSERS:
        chosen = [a for a in (*args, *node.kwargs.values()) if a is not None]
        return _hull([(0, 0), *(value_range(a, depth) for a in chosen)])
    if name in _FILLS and len(args) > _FILLS[name]:
        return value_range(args[_FILLS[name]], depth)
    return (0, 1) if name in _CONSTANT_FILLS else None


def _arithmetic_range(node: fx.Node, name: str, depth: int) -> Range | None:
    """The range of a sum, difference or product (``alpha`` scales the second operand)."""
    first, second = (value_range(a, depth) for a in (*node.args, 0, 0)[:2])
    alpha = value_range(node.kwargs.get("alpha", 1), depth)
    if first is None or second is None or alpha is None:
        return None
    if name in _MULS:
        return _product(first, second)
    if name in ("rsub", "__rsub__"):
        first, second = second, first
    second = _product(second, alpha)
    if name in _SUBS or name in ("rsub", "__rsub__"):
        second = (-second[1], -second[0])
    return first[0] + second[0], first[1] + second[1]


def _clamp_range(node: fx.Node, name: str, depth: int) -> Range | None:
    """``min(max(x, low), high)``'s range, each bound optional (``clamp_min`` has a low one,
    ``clamp_max`` a high one); monotone in each argument, so its ends are the ends' images."""
    found = value_range(node.args[0], depth)
    bounds = dict(zip(_CLAMPS[name], node.args[1:]))
    bounds.update((k, v) for k, v in node.kwargs.items() if k in ("min", "max"))
    for key, pick in (("min", max), ("max", min)):
        if found is None or bounds.get(key) is None:
            continue
        bound = value_range(bounds[key], depth)
        found = None if bound is None else (pick(found[0], bound[0]), pick(found[1], bound[1]))
    return found


def _product(first: Range, second: Range) -> Range:
    corners = [a * b for a in first for b in second]
    return min(corners), max(corners)


def _sign_range(found: Range | None, name: str) -> Range | None:
    if found is None:
        return None
    negated = (-found[1], -found[0])
    if name == "sign":
        return _signum(found[0]), _signum(found[1])
    if name in ("neg", "__neg__"):
        return negated
    if found[0] >= 0:
        return found
    return negated if found[1] <= 0 else (0, max(-found[0], found[1]))


def _signum(value: int) -> int:
    return (value > 0) - (value < 0)


def _sum_range(node: fx.Node, name: str, depth: int) -> Range | None:
    """A running sum's or a sum's range: its input's, times the count of terms (the size of
    its axis; for a sum over several axes or all, the input's element count)."""
    source = node.args[0]
    shape = getattr(node_value_meta(source), "shape", None) if isinstance(source, fx.Node) else None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if shape is None or name == "cumsum" and not isinstance(dims, int):
        return None
    terms = 1
    for dim in range(len(shape)) if dims is None else (dims,) if isinstance(dims, int) else dims:
        inside = isinstance(dim, int) and -len(shape) <= dim < len(shape)
        size = _size_range(shape[dim]) if inside else None
        if size is None:
            return None
        terms *= size[1]
    element = value_range(source, depth)
    if element is None:
        return None
    return min(element[0], 0) * terms, max(element[1], 0) * terms


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.target is operator.getitem:
        return "getitem"
    return getattr(node.target, "__name__", "") or str(node.target)


def _size_range(size: int | torch.SymInt) -> Range | None:
    """A size's range: its value where static; where symbolic, from its expression over the
    inputs' dimensions and int inputs, each within the guard."""
    if isinstance(size, int):
        return size, size
    return _expression_range(size.node.expr)


def _expression_range(expr: Any) -> Range | None:
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        return GUARDED_RANGE
    parts = [_expression_range(a) for a in expr.args]
    if not parts or any(p is None for p in parts):
        return None
    total = parts[0]
    for part in parts[1:]:
        if expr.is_Add:
            total = (total[0] + part[0], total[1] + part[1])
        elif expr.is_Mul:
            total = _product(total, part)
        else:
            return None
    return total


def _constant_range(value: Any) -> Range | None:
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex():
        return None
    if not value.numel():
        return 0, 0
    return int(value.min()), int(value.max())


def _hull(ranges: Iterable[Range | None]) -> Range | None:
    found = list(ranges)
    if not found or any(r is None for r in found):
        return None
    return min(r[0] for r in found), max(r[1] for r in found)
