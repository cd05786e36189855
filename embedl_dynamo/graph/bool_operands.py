"""The exportable form of a binary op with a Python ``bool`` operand: ``m <= True``, ``mask &
True``, ``x * False``.

PyTorch takes a Python bool as a scalar operand of comparisons, arithmetic and bitwise ops. The
TorchScript exporter takes none of them: it stops at an internal assert ("We don't have an op
for aten::le ... Argument types: Tensor, bool"), and the whole graph it was exporting then
runs in PyTorch. Here the bool becomes the operand PyTorch computes the same result with:

* a comparison, or arithmetic on a tensor that is not bool: the int ``0`` or ``1``. A bool
  scalar ranks below every tensor dtype in type promotion, as an int scalar does below every
  non-bool one, so the result's dtype and values stay PyTorch's;
* a bitwise op on a bool tensor: a 0-d bool tensor, which keeps the result bool (an int
  scalar would make it int64);
* ``+`` and ``*`` of a bool tensor with a bool, which PyTorch computes as ``|`` and ``&``:
  those ops with a 0-d bool tensor.

Bitwise ops on integer tensors are left as they are: the exporter takes none, with any operand.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import looked_up

__all__ = ["bool_operand_form", "exact_bool_operand"]

_COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne"}
_ARITHMETIC = {"add", "mul", "truediv", "div"}  # not sub: PyTorch refuses a bool there
_BITWISE = {"and_", "or_", "xor", "bitwise_and", "bitwise_or", "bitwise_xor"}
#: arithmetic PyTorch computes on bools as a bitwise op
_BOOL_ARITHMETIC = {"add": operator.or_, "mul": operator.and_}

_OPERATOR_NAMES = (*_COMPARISONS, "add", "mul", "truediv", "and_", "or_", "xor")
_TORCH_NAMES = (
    *_COMPARISONS,
    "add",
    "mul",
    "div",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
)
#: a function's name in the graph's form -> the function
_CALLS: dict[str, Callable[..., Any]] = {
    **{f"operator.{name}": getattr(operator, name) for name in _OPERATOR_NAMES},
    **{f"torch.{name}": getattr(torch, name) for name in _TORCH_NAMES},
}
#: a function -> (its name in _CALLS, the kind of op it is)
_FUNCTIONS: dict[Any, tuple[str, str]] = {
    **{getattr(operator, n): (f"operator.{n}", n) for n in _OPERATOR_NAMES},
    **{getattr(torch, n): (f"torch.{n}", n) for n in _TORCH_NAMES},
}
_REFLECTED = {"and": "and_", "or": "or_", "xor": "xor"}
#: a Tensor method -> the kind of op it is (``x.__rtruediv__(True)`` is ``True / x``)
_METHODS: dict[str, str] = {
    **{name: name for name in (*_COMPARISONS, "add", "mul", "div")},
    **{name: name for name in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    **{f"__{name}__": name for name in (*_COMPARISONS, "add", "mul", "truediv")},
    **{f"__r{name}__": name for name in ("add", "mul", "truediv")},
    **{f"__{name}__": kind for name, kind in _REFLECTED.items()},
    **{f"__r{name}__": kind for name, kind in _REFLECTED.items()},
}


def exact_bool_operand(
    input: Any,  # noqa: A002
    other: Any,
    *,
    call: str,
    kind: str,
    alpha: int = 1,
) -> Any:
    """``call(input, other)`` as PyTorch computes it, with a Python bool operand written as an
    operand the exporter takes (see the module docstring).

    Args:
        input: the first operand (a tensor, or a bool whose other operand is one).
        other: the second operand.
        call: ``"operator.le"``, ``"torch.bitwise_and"``... or ``"method.__rtruediv__"``: a
            Tensor method called on ``input``.
        kind: the op (``"le"``, ``"add"``, ``"and_"``...).
        alpha: ``torch.add``'s: only 1, which changes nothing, is written.
    """
    del alpha  # bool_operand_form writes this form for alpha=1 only
    a, b = input, other
    op = _call(call)
    tensor = a if isinstance(a, torch.Tensor) else b
    if tensor.dtype == torch.bool and kind in _BOOL_ARITHMETIC:
        op = _BOOL_ARITHMETIC[kind]
    as_tensor = tensor.dtype == torch.bool and (kind in _BITWISE or kind in _BOOL_ARITHMETIC)
    return op(_operand(a, as_tensor), _operand(b, as_tensor))


def _operand(value: Any, as_tensor: bool) -> Any:
    if type(value) is not bool:
        return value
    return torch.tensor(value) if as_tensor else int(value)


def bool_operand_form(node: fx.Node) -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """The exact form of ``node`` and the keyword arguments to add, where it is a binary op of
    a tensor and a Python bool that the exporter fails on; None otherwise."""
    found = _call_and_kind(node)
    operands = _operands(node)
    if found is None or operands is None:
        return None
    call, kind = found
    a, b = operands
    if not any(type(v) is bool for v in (a, b)) or not any(isinstance(v, fx.Node) for v in (a, b)):
        return None
    tensor = _tensor_value(a if isinstance(a, fx.Node) else b)
    if tensor is None or (kind in _BITWISE and tensor.dtype != torch.bool):
        return None  # not a tensor, or an integer bitwise op: no exportable form
    if tensor.dtype == torch.bool and kind in _ARITHMETIC and kind not in _BOOL_ARITHMETIC:
        return None  # PyTorch refuses it, as it will the copy
    return exact_bool_operand, {"call": call, "kind": kind}


def _operands(node: fx.Node) -> tuple[Any, Any] | None:
    """The two operands, passed by position or as ``input``/``other`` (with ``alpha=1`` at
    most); None for any other call."""
    kwargs = dict(node.kwargs)
    if kwargs.pop("alpha", 1) != 1:
        return None
    operands = [*node.args, *(kwargs.pop(k) for k in ("input", "other") if k in kwargs)]
    return (operands[0], operands[1]) if len(operands) == 2 and not kwargs else None


def _call_and_kind(node: fx.Node) -> tuple[str, str] | None:
    if node.op == "call_method" and str(node.target) in _METHODS:
        return f"method.{node.target}", _METHODS[str(node.target)]
    return looked_up(_FUNCTIONS, node.target) if node.op == "call_function" else None


def _call(call: str) -> Callable[[Any, Any], Any]:
    """The function ``call`` names; a ``method.`` name calls that Tensor method on its first
    argument (a reflected one: ``True / x`` is ``x.__rtruediv__(True)``)."""
    kind, _, name = call.partition(".")
    if kind == "method":
        return lambda self, other: getattr(self, name)(other)
    return _CALLS[call]


def _tensor_value(node: fx.Node) -> torch.Tensor | None:
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None
