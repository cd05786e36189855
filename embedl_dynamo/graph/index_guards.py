"""Per-call index guards: a graph that also says when an index is outside PyTorch's range.

PyTorch raises for an index outside an op's range (:mod:`embedl_dynamo.graph.index_ops`);
ONNX Runtime and OpenVINO wrap a negative one and OpenVINO reads zeros past the end, so a
runtime would answer a call PyTorch refuses. :func:`guard_indices` gives the graph one more
output, last: a 0-d bool, True when some guarded index of this call is out of range. For an
index tensor ``i`` addressing a dimension of size ``n`` (a ``size`` call in the graph, so
dynamic shapes keep working)::

    low = (i + n if negatives are taken else i) < 0      # below the range
    high = i >= n                                        # past its end
    count = (low.int() + high.int()).sum()               # 0 when neither (both: i + n
    flag = (count_1 + count_2 + ...) != 0                # wrapped, when i >= n)

one pass over each index tensor, in ops every CPU runtime computes exactly on the integers
and counts involved, each with a row in the conformance table (an int32 sum of 0s and 1s is
0 only when all are 0, and no quantizer places Q/DQ on integer ops). An index the graph
proves in range (a constant, an ``arange`` over the indexed size) is not guarded, with the
reason (:func:`index_checks`). The caller runs the guarded graph, hands its outputs to
:meth:`IndexGuard.split` and, when that raises, runs the call in PyTorch, which raises
PyTorch's own error.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from embedl_dynamo.errors import IndexGuardError
from embedl_dynamo.graph.index_ops import (
    IndexUse,
    index_uses,
    known_true,
    proven_range,
    size_of,
    tensor_size,
)
from embedl_dynamo.graph.nodes import constant_value, module_path, node_value_meta

__all__ = ["IndexCheck", "IndexGuard", "guard_indices", "index_checks"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexCheck:
    """One index of one op, and whether the guard checks it.

    Attributes:
        op: the op and where it is, ``op@module.path`` (``op@node`` outside modules).
        guarded: whether each call checks it.
        reason: why it is not checked (empty when it is).
    """

    op: str
    guarded: bool
    reason: str = ""


@dataclass(frozen=True)
class IndexGuard:
    """A graph whose last output flags an index outside PyTorch's range on this call.

    Attributes:
        graph: the input graph plus one more output, last: a 0-d bool, True when some
            guarded index is out of PyTorch's range on this call.
        ops: the ops guarded, for the report.
    """

    graph: fx.GraphModule
    ops: tuple[str, ...]

    def split(self, outputs: Sequence[Any]) -> tuple[Any, ...]:
        """``outputs`` of :attr:`graph` without the flag.

        Raises:
            IndexGuardError: the flag is set: PyTorch raises on this call.
        """
        *rest, flag = outputs
        if bool(flag):
            raise IndexGuardError(
                f"an index is outside the range PyTorch takes in {', '.join(self.ops)} on "
                "this call; run the call in PyTorch, which raises its own error"
            )
        return tuple(rest)


def _name(use: IndexUse) -> str:
    return f"{use.op}@{module_path(use.node) or use.node.name}"


def _proof(gm: fx.GraphModule, use: IndexUse) -> str | None:
    """Why ``use``'s index is always in range, or None when the graph does not prove it."""
    proven = proven_range(gm, use.index)
    size = size_of(gm, use.tensor, use.dim)
    if proven is None or size is None:
        return None
    lo, hi, what = proven
    low = -size if use.negatives else 0
    if known_true(hi <= lo) or (known_true(lo >= low) and known_true(hi <= size)):
        return f"the index is {what} within PyTorch's range"
    return None


def _plan(gm: fx.GraphModule) -> tuple[list[IndexUse], list[IndexCheck]]:
    """The uses to guard (one per index, tensor, dim and range) and a check for each index."""
    uses, unknown = index_uses(gm)
    guarded: dict[tuple[Any, ...], IndexUse] = {}
    checks = [IndexCheck(f"{node.target}@{node.name}", False, reason) for node, reason in unknown]
    for use in uses:
        reason = _proof(gm, use)
        checks.append(IndexCheck(_name(use), reason is None, reason or ""))
        if reason is None:
            key = (id(use.index), use.tensor, use.dim, use.negatives)
            guarded.setdefault(key, use)
    return list(guarded.values()), checks


def index_checks(gm: fx.GraphModule) -> tuple[IndexCheck, ...]:
    """Every index of every index op of ``gm``, and whether :func:`guard_indices` checks it
    on each call (with the reason where it does not)."""
    return tuple(_plan(gm)[1])


def _fake_mode(gm: fx.GraphModule) -> Any:
    """The fake mode of ``gm``'s example values (None: it has none)."""
    for node in gm.graph.nodes:
        value = node_value_meta(node)
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return None


def _with_meta(node: fx.Node, mode: Any) -> fx.Node:
    """``node`` with its ``example_value`` computed from its inputs', in the graph's fake
    ``mode`` (None: on real values), as Dynamo records it; none when an input has none."""
    if any(node_value_meta(n) is None for n in node.all_input_nodes):
        return node
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), node_value_meta)
    try:
        with torch.no_grad(), mode if mode is not None else contextlib.nullcontext():
            if node.op == "call_method":
                value = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:
                value = node.target(*args, **kwargs)
    except Exception as error:  # the value stays unknown, as for a node without a meta kernel
        logger.debug("no example value for %s: %s", node.name, error)
        return node
    node.meta["example_value"] = value
    return node


class _Builder:
    """Inserts the check nodes of each guarded index before its op."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.mode = _fake_mode(gm)
        self.sizes: dict[tuple[fx.Node, int | None], fx.Node] = {}

    def call(self, op: str, target: Any, *args: Any) -> fx.Node:
        create = self.graph.call_method if op == "call_method" else self.graph.call_function
        return _with_meta(create(target, args), self.mode)

    def size(self, tensor: fx.Node, dim: int | None) -> fx.Node | int:
        """The size as a node, or an int for a constant (an embedding table: a ``size`` call
        would read the table outside its lookups, and keep it float under weight-only
        precisions) and for a 0-d tensor."""
        if tensor.op == "get_attr":
            value = constant_value(self.gm, tensor)
            if isinstance(value, torch.Tensor):
                return int(tensor_size(value, dim))
        value = node_value_meta(tensor)
        if dim is not None and isinstance(value, torch.Tensor) and value.dim() == 0:
            return 1  # a 0-d tensor is one element along dim 0; ``size(0)`` of it raises
        key = (tensor, dim)
        if key not in self.sizes:
            args = (tensor,) if dim is None else (tensor, dim)
            self.sizes[key] = self.call("call_method", "numel" if dim is None else "size", *args)
        return self.sizes[key]

    def count(self, use: IndexUse) -> fx.Node:
        """A 0-d int: how many of ``use``'s index values are out of range."""
        with self.graph.inserting_before(use.node):
            index = use.index
            if isinstance(index, list):  # a constant list the graph does not prove in range
                index = self.call("call_function", torch.tensor, index)
            size = self.size(use.tensor, use.dim)
            shifted = (
                self.call("call_function", operator.add, index, size) if use.negatives else index
            )
            low = self.call("call_function", operator.lt, shifted, 0)
            high = self.call("call_function", operator.ge, index, size)
            # "or" as an int32 sum: ORT has no bool Where, and an INT8 quantizer would place
            # Q/DQ on a float add (OpenVINO then failed to compile the file)
            low, high = (self.call("call_method", "int", bound) for bound in (low, high))
            both = self.call("call_function", operator.add, low, high)
            return self.call("call_method", "sum", both)


def guard_indices(gm: fx.GraphModule) -> IndexGuard | None:
    """``gm`` with one more output, last: True when an index of this call is outside the
    range PyTorch takes (:class:`IndexGuard`).

    Args:
        gm: a frozen, functional graph (Dynamo's, with ``example_value`` metadata); not
            changed.

    Returns:
        The guard over a copy of ``gm`` (its constants shared), or None when no index needs
        one: no index op, or each index proven in range (:func:`index_checks` says why).
    """
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = fx.GraphModule(gm, graph, gm.__class__.__name__)
    copy.meta.update(gm.meta)
    uses, checks = _plan(copy)
    for check in checks:
        if not check.guarded:
            logger.debug("index of %s not guarded: %s", check.op, check.reason)
    if not uses:
        return None
    builder = _Builder(copy)
    counts = [builder.count(use) for use in uses]
    output = copy.graph.output_node()
    with copy.graph.inserting_before(output):
        total = counts[0]
        for count in counts[1:]:
            total = builder.call("call_function", operator.add, total, count)
        flag = builder.call("call_function", operator.ne, total, 0)
    returned = output.args[0]
    if isinstance(returned, (tuple, list)):
        output.args = (type(returned)([*returned, flag]),)
    else:
        output.args = ((returned, flag),)
    copy.recompile()
    ops = tuple(dict.fromkeys(_name(use) for use in uses))
    return IndexGuard(copy, ops)
