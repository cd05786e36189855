"""Python numbers among a Dynamo graph's inputs, made what an exported artifact can take.

Dynamo passes a float argument that changed as a 0-d float64 tensor read with ``.item()``, and
an int that is no tensor's size as a ``SymInt``; an exporter would bake either into the file as
the traced value and drop the input. So, while freezing: a float used as an operand of
elementwise arithmetic stays a tensor input (:func:`scalar_as_tensor`), a float read only as a
number (an ``eps``) becomes a constant the caller guards (:func:`bake_scalar`), and an int
that only meets tensor ops becomes a 0-d int64 tensor input (:func:`int_as_tensor`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

__all__ = ["bake_scalar", "int_as_tensor", "scalar_as_tensor"]


def scalar_as_tensor(new: fx.Node, old: fx.Node) -> None:
    """Keep a Python ``float`` input a tensor input: drop the ``.item()`` Dynamo reads it with.

    Once a float argument changed, Dynamo passes it as a 0-d float64 tensor
    (``pass_arg_as_tensor``) and reads it back with ``.item()``. An exporter traces ``.item()``
    to a constant: the artifact would ignore the input. Where every use of the value is a
    tensor op, the 0-d tensor, cast to the dtype that op computes in (as PyTorch casts a
    Python scalar), replaces the ``.item()``; other uses keep it (the runtime then refuses the
    input it lost, and such calls run in PyTorch).
    """
    if not getattr(old.meta.get("grapharg"), "pass_arg_as_tensor", False):
        return
    for item in list(new.users):
        if item.op != "call_method" or item.target != "item" or len(item.args) != 1:
            continue
        results = [_fake_tensor(user) for user in item.users]
        if not results or any(r is None for r in results):
            continue
        if not all(_is_operand(item, user) for user in item.users):
            continue  # e.g. SDPA's scale: graph/attention_forms.bind_attention_scales takes it
        for user, result in zip(list(item.users), results):
            with new.graph.inserting_before(user):
                cast = new.graph.call_method("to", (new, result.dtype))
            user.replace_input_with(item, cast)
        new.graph.erase_node(item)


_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


def bake_scalar(new: fx.Node, old: fx.Node, value: Any) -> bool:
    """Hold a float input that is read only as a number (a LayerNorm's ``eps`` or dropout's
    ``p`` under ``dynamic=True``) as the constant it is now, and erase the input.

    An exporter would bake it anyway and drop the input; the caller records the value
    (:attr:`FrozenGraph.specialized`) so that a call with another value runs the original
    graph. SDPA's ``scale`` is left a graph value for
    :func:`~embedl_dynamo.graph.attention_forms.bind_attention_scales`. False: unchanged.
    """
    if not getattr(old.meta.get("grapharg"), "pass_arg_as_tensor", False):
        return False
    items = list(new.users)
    if not items or any(i.op != "call_method" or i.target != "item" for i in items):
        return False
    if any(user.target in _SDPA for item in items for user in item.users):
        return False
    number = float(value)
    for item in items:
        for user in list(item.users):
            user.replace_input_with(item, number)
        new.graph.erase_node(item)
    new.graph.erase_node(new)
    return True


_INT_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.neg})
# max/min of an int and a literal, and what computes it on a 0-d int64 tensor
_INT_BOUNDS = {torch.sym_max: "min", torch.sym_min: "max"}


def int_as_tensor(new: fx.Node) -> bool:
    """Make an int input (a ``SymInt`` that is no tensor's size) a 0-d int64 tensor input.

    Possible where the int only meets tensor ops, directly or through ``+ - *`` of ints and
    ``sym_max`` / ``sym_min`` with a literal (which give the same values on an int64 tensor,
    the latter as ``clamp``), or is returned as a number (the graph's number outputs are
    computed in PyTorch from the call's ints, :mod:`.scalar_outputs`); each tensor op gets it
    cast to the dtype it computes in, as PyTorch casts a Python int. Returns False, the graph
    unchanged, otherwise (a size argument, a comparison, a bound by another number).
    """
    chain, tensor_uses, bounds, todo = [new], [], [], [new]
    while todo:
        for user in todo.pop().users:
            result = user.meta.get("example_value", user.meta.get("val"))
            if user.op == "output":
                continue
            if isinstance(result, torch.Tensor):
                if not any(_is_operand(node, user) for node in chain if node in user.args):
                    return False
                tensor_uses.append(user)
            elif user.op == "call_function" and user.target in (*_INT_ARITHMETIC, *_INT_BOUNDS):
                if user.target in _INT_BOUNDS:
                    if sum(isinstance(a, int) for a in user.args) != 1 or user.kwargs:
                        return False  # bounded by another number: not a clamp
                    bounds.append(user)
                if user not in chain and isinstance(result, (int, torch.SymInt)):
                    chain.append(user)
                    todo.append(user)
            else:
                return False
    for user in bounds:
        (value,) = (a for a in user.args if isinstance(a, fx.Node))
        (limit,) = (a for a in user.args if isinstance(a, int))
        user.target, user.args, user.kwargs = (
            torch.clamp,
            (value,),
            {_INT_BOUNDS[user.target]: limit},
        )
    for user in tensor_uses:
        dtype = _fake_tensor(user).dtype
        for node in [a for a in user.all_input_nodes if a in chain]:
            with new.graph.inserting_before(user):
                cast = new.graph.call_method("to", (node, dtype))
            user.replace_input_with(node, cast)
    return True


# elementwise arithmetic: a Python number operand and a 0-d tensor of the op's dtype agree
_ARITHMETIC_FUNCTIONS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.pow,
        torch.add,
        torch.sub,
        torch.mul,
        torch.div,
        torch.true_divide,
        torch.pow,
        torch.maximum,
        torch.minimum,
    }
)
_ARITHMETIC_METHODS = frozenset({"add", "sub", "mul", "div", "true_divide", "pow"})


def _is_operand(value: fx.Node, user: fx.Node) -> bool:
    """Whether ``user`` is elementwise arithmetic that takes ``value`` as a positional operand
    (not a keyword such as SDPA's ``scale`` or a norm's ``eps``, which must stay numbers)."""
    arithmetic = (user.op == "call_function" and user.target in _ARITHMETIC_FUNCTIONS) or (
        user.op == "call_method" and user.target in _ARITHMETIC_METHODS
    )
    return arithmetic and value in user.args


def _fake_tensor(node: fx.Node) -> torch.Tensor | None:
    fake = node.meta.get("example_value", node.meta.get("val"))
    return fake if isinstance(fake, torch.Tensor) else None
