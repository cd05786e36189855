"""Split a graph's Python-number outputs (``y.shape[0]``) from its tensor outputs.

After a dynamic recompile Dynamo may return a size among the outputs (``return y,
y.shape[0]``: the graph returns the ``SymInt``). An artifact returns tensors only, so, as
inductor does for the ``SymInt`` outputs of its graphs, such a number is computed in PyTorch
from the inputs' shapes at each call: the tensor outputs go to the artifact, the numbers to a
small graph of size reads and integer arithmetic, and :meth:`ScalarOutputs.merge` puts them
back in their places, as Python numbers. A number the graph reads off an intermediate tensor
(a KV cache's length grown by ``key_states.shape[-2]``) is computed from its symbolic
expression over the inputs' sizes and ints instead. A number computed from tensor values
(``.item()``) is no size: such a graph is not split (:attr:`SplitOutputs.blocker` says why).
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

__all__ = ["ScalarOutputs", "SplitOutputs", "split_scalar_outputs"]

# reads of a tensor's shape, and arithmetic on the numbers they give
_SIZE_METHODS = frozenset({"size", "dim", "numel"})
_SIZE_FUNCTIONS = frozenset(
    {
        getattr(operator, n)
        for n in (
            "add",
            "sub",
            "mul",
            "floordiv",
            "truediv",
            "mod",
            "neg",
            "pow",
            "getitem",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
        )
    }
    | {
        math.floor,
        math.ceil,
        getattr,
        torch.sym_int,
        torch.sym_float,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
    }
    | {torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default}
)


@dataclass
class ScalarOutputs:
    """The graph's number outputs, computed from its inputs.

    Attributes:
        gm: takes the graph's inputs, returns the numbers as a tuple (size reads only).
        positions: where each number goes among the graph's outputs.
        count: how many outputs the graph returns in all.
    """

    gm: fx.GraphModule
    positions: tuple[int, ...]
    count: int

    def merge(self, tensors: Sequence[Any], inputs: Sequence[Any]) -> tuple[Any, ...]:
        """The artifact's ``tensors`` with the numbers computed from ``inputs`` in place."""
        # an int input the artifact takes as a 0-d tensor gives a 0-d tensor here: a number
        numbers = iter(v.item() if isinstance(v, torch.Tensor) else v for v in self.gm(*inputs))
        tensor = iter(tensors)
        places = set(self.positions)
        return tuple(next(numbers) if i in places else next(tensor) for i in range(self.count))


@dataclass
class SplitOutputs:
    """What :func:`split_scalar_outputs` returns.

    Attributes:
        tensors: the graph returning its tensor outputs only (the graph itself when it
            returns no number).
        scalars: how the numbers are computed, or None when there are none.
        blocker: why the graph cannot be split (a number that is not a size), or None.
    """

    tensors: fx.GraphModule
    scalars: ScalarOutputs | None = None
    blocker: str | None = None


def _returned(gm: fx.GraphModule) -> tuple[fx.Node, list[Any]]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = output.args[0]
    return output, list(value) if isinstance(value, (tuple, list)) else [value]


def _is_number(value: Any) -> bool:
    if isinstance(value, fx.Node):
        fake = value.meta.get("example_value", value.meta.get("val"))
        return isinstance(fake, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))
    return isinstance(value, (int, float, bool))


def _keeping(gm: fx.GraphModule, values: list[Any]) -> fx.GraphModule:
    """A copy of ``gm`` returning the tuple ``values`` (nodes of ``gm``), dead code removed."""
    graph = fx.Graph()
    mapping: dict[fx.Node, fx.Node] = {}
    graph.graph_copy(gm.graph, mapping)
    graph.output(tuple(mapping[v] if isinstance(v, fx.Node) else v for v in values))
    graph.eliminate_dead_code()
    kept = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    kept.meta.update(copy.copy(getattr(gm, "meta", {})))
    return kept


def _not_a_size(gm: fx.GraphModule) -> str | None:
    """Why the numbers' graph is more than size reads of its inputs and arithmetic on them."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_method" and node.target in _SIZE_METHODS:
            if node.args[0].op == "placeholder":
                continue
        elif node.op == "call_function" and node.target in _SIZE_FUNCTIONS:
            continue
        target = getattr(node.target, "__name__", node.target)
        return f"a number among the outputs needs {node.op} {target} ({node.name}), not sizes only"
    return None


def _symbol_reads(gm: fx.GraphModule, graph: fx.Graph) -> dict[Any, Any]:
    """Placeholders of ``graph`` like ``gm``'s, and a node reading each size symbol of them (an
    int input, or an input tensor's dimension), by symbol."""
    reads: dict[Any, Any] = {}
    for old in [n for n in gm.graph.nodes if n.op == "placeholder"]:
        new = graph.placeholder(old.name)
        fake = old.meta.get("example_value", old.meta.get("val"))
        if isinstance(fake, torch.SymInt) and fake.node.expr.is_Symbol:
            reads.setdefault(fake.node.expr, new)
        elif isinstance(fake, torch.Tensor):
            for dim, size in enumerate(fake.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    reads.setdefault(size.node.expr, graph.call_method("size", (new, dim)))
    return reads


def _expression(graph: fx.Graph, expr: Any, reads: dict[Any, Any]) -> Any:
    """Nodes of ``graph`` computing the sympy ``expr`` from ``reads``; None where it has a
    symbol no input carries or an operation other than + * max min //."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return reads.get(expr)
    ops = {
        sympy.Add: operator.add,
        sympy.Mul: operator.mul,
        sympy.Max: max,
        sympy.Min: min,
        FloorDiv: operator.floordiv,
    }
    op = ops.get(type(expr))
    args = [_expression(graph, a, reads) for a in expr.args]
    if op is None or any(a is None for a in args):
        return None
    value = args[0]
    for arg in args[1:]:
        value = graph.call_function(op, (value, arg))
    return value


def _from_symbols(gm: fx.GraphModule, values: list[Any]) -> fx.GraphModule | None:
    """A graph computing ``values`` (number outputs of ``gm``) from their symbolic expressions
    over the inputs' sizes and ints, for numbers the graph reads off intermediate tensors
    (``key_states.shape[-2]`` is the prompt's length); None if one is no such expression."""
    graph = fx.Graph()
    reads = _symbol_reads(gm, graph)
    outputs = []
    for value in values:
        fake = value.meta.get("example_value") if isinstance(value, fx.Node) else None
        node = _expression(graph, fake.node.expr, reads) if isinstance(fake, torch.SymInt) else None
        if node is None:
            return None
        outputs.append(node)
    graph.output(tuple(outputs))
    return fx.GraphModule(torch.nn.Module(), graph, class_name="Numbers")


def split_scalar_outputs(gm: fx.GraphModule) -> SplitOutputs:
    """Split the number outputs of the frozen graph ``gm`` from its tensor outputs.

    Args:
        gm: a frozen graph (its placeholders are the user inputs); not modified.

    Returns:
        A :class:`SplitOutputs`: ``gm`` itself when it returns tensors only.
    """
    _, values = _returned(gm)
    positions = tuple(i for i, v in enumerate(values) if _is_number(v))
    if not positions:
        return SplitOutputs(gm)
    if len(positions) == len(values):
        return SplitOutputs(gm, blocker="the graph returns numbers only, no tensor")
    numbers = _keeping(gm, [values[i] for i in positions])
    blocker = _not_a_size(numbers)
    if blocker is not None:  # sizes of intermediate tensors: the same from their symbols
        numbers = _from_symbols(gm, [values[i] for i in positions])
    if numbers is None:
        return SplitOutputs(gm, blocker=blocker)
    tensors = _keeping(gm, [v for i, v in enumerate(values) if i not in positions])
    return SplitOutputs(tensors, ScalarOutputs(numbers, positions, len(values)))
