"""Reading the conformance table: an op's rule, and whether a graph may run on a runtime.

The table is an allow-list for the runtimes it speaks for (:data:`~.rules.CPU_RUNTIMES`): a
graph reaches one of them only when every op in it has a row whose rule for that runtime and
the op's input dtype says ``exact`` or ``bounded``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import fx

from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.graph.view_writes import POSITIONS_META
from embedl_dynamo.runtimes.conformance.int_bounds import (
    INT32_RANGE,
    inside,
    value_range,
)
from embedl_dynamo.runtimes.conformance.op_names import input_dtype, op_name
from embedl_dynamo.runtimes.conformance.rules import CPU_RUNTIMES, Difference, OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.table import ROWS

__all__ = [
    "NON_FINITE_EDGES",
    "differences",
    "kept_in_pytorch",
    "needs_finite_inputs",
    "node_blocker",
    "op_name",
    "rule_for",
]

#: the edges of a :class:`~.rules.Difference` that a per-call guard on non-finite inputs covers
NON_FINITE_EDGES = ("nan", "inf", "-inf")
#: edges whose values PyTorch leaves undefined (which of duplicate scatter indices lands)
UNDEFINED_EDGES = ("ties",)

_BY_NAME: dict[str, OpRow] = {}
for _row in ROWS:
    for _name in (_row.op, *_row.aliases):
        _BY_NAME[_name] = _row


def rule_for(op: str, runtime: str, dtype: torch.dtype | None) -> Rule | None:
    """The rule on ``op`` for ``runtime`` and an input of ``dtype`` (None: no row for it)."""
    return next(iter(_covering(op, runtime, dtype)), None)


def _covering(op: str, runtime: str, dtype: torch.dtype | None) -> list[Rule]:
    """The rules of ``op``'s row for ``runtime`` that cover ``dtype`` (an unknown dtype: every
    rule of the row; no row: none)."""
    row = _BY_NAME.get(op)
    return [r for r in (row.rules.get(runtime, ()) if row is not None else ()) if r.covers(dtype)]


def differences(op: str, runtime: str) -> tuple[Difference, ...]:
    """The known differences of ``op`` on ``runtime`` (:class:`~.rules.Difference`)."""
    row = _BY_NAME.get(op)
    return tuple(d for d in row.differs if d.runtime == runtime) if row is not None else ()


def _judge(op: str, runtime: str, dtype: torch.dtype | None) -> str | None:
    """Why ``op`` on an input of ``dtype`` may not run on ``runtime`` (None: it may)."""
    what = f"{op} on {dtype}" if dtype is not None else op
    covering = _covering(op, runtime, dtype)
    if not covering:
        return f"{what} has no conformance row for {runtime}; runs in PyTorch"
    # a known dtype: the first rule that covers it (a bool rule before the integer one); an
    # unknown one: any rule that keeps it
    rules = covering[:1] if dtype is not None else covering
    kept = next((r for r in rules if r.verdict is Verdict.KEPT), None)
    return f"{what} stays in PyTorch on {runtime}: {kept.reason}" if kept is not None else None


def node_blocker(node: fx.Node, runtime: str) -> str | None:
    """Why ``node`` may not run on ``runtime`` (None: it may, or it computes nothing a runtime
    could compute otherwise): no row for its op and input dtype, a row that says ``kept``
    (with the row's reason), or a float64 value on OpenVINO. Runtimes the table does not
    speak for (TensorRT, third-party ones) are not judged here."""
    if runtime not in CPU_RUNTIMES:
        return None
    op = op_name(node)
    if op is None or node.meta.get(POSITIONS_META):
        return None  # a scatter's element positions are exact below 2**31 elements
    if all(not user.users and user.op != "output" for user in node.users):
        # nothing reads its value, or only a node nothing reads (Dynamo's ``not (s0 == s0)``
        # of a size check): no runtime computes it (dead code)
        return None
    dtype = input_dtype(node)
    return (
        _judge(op, runtime, dtype)
        or _float64_on_openvino(node, op, runtime)
        or _int64_past_int32_on_openvino(node, op, runtime)
        or _finite_difference(op, runtime, dtype)
    )


def needs_finite_inputs(node: fx.Node, runtime: str) -> bool:
    """Whether ``node``'s op computes otherwise than PyTorch on ``runtime`` where a NaN or an
    infinity reaches it (a :class:`~.rules.Difference` on a non-finite edge): a graph holding
    it may run there only behind a guard that sends calls with non-finite inputs to PyTorch."""
    op = op_name(node)
    if op is None or runtime not in CPU_RUNTIMES:
        return False
    return any(d.edge in NON_FINITE_EDGES for d in differences(op, runtime))


def _finite_difference(op: str, runtime: str, dtype: torch.dtype | None) -> str | None:
    """A listed difference on finite inputs (uint8 saturating where PyTorch wraps) keeps the
    op in PyTorch: no guard can see it coming. Ties (duplicate scatter indices) are values
    PyTorch itself leaves undefined."""
    if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
        return None  # the float edges are non-finite ones, which a guard covers
    for difference in differences(op, runtime):
        if difference.edge not in (*NON_FINITE_EDGES, *UNDEFINED_EDGES):
            return f"{op} on {dtype} stays in PyTorch on {runtime}: {difference.reason}"
    return None


def kept_in_pytorch(gm: fx.GraphModule, runtimes: Iterable[str]) -> str | None:
    """Why ``gm`` runs in PyTorch rather than on ``runtimes`` as a whole (None: nothing keeps
    it): the first node :func:`node_blocker` keeps from one of them."""
    for node in gm.graph.nodes:
        for runtime in runtimes:
            reason = node_blocker(node, runtime)
            if reason is not None:
                return reason
    return None


def _float64_on_openvino(node: fx.Node, op: str, runtime: str) -> str | None:
    """OpenVINO's CPU plugin computes float64 as float32, whatever the op: an int32 of
    ``2**31 - 1`` converted to float64 came back ``2**31``, and float64 infinities the largest
    float32. A node with a float64 value runs in PyTorch there."""
    value = node_value_meta(node)
    if runtime != "openvino" or getattr(value, "dtype", None) != torch.float64:
        return None
    return f"{op} makes float64, which OpenVINO computes as float32; runs in PyTorch"


def _int64_past_int32_on_openvino(node: fx.Node, op: str, runtime: str) -> str | None:
    """OpenVINO's CPU plugin computes int64 as int32: a node whose int64 values the graph
    shows leaving int32 (a large constant chosen by ``where``, filled, or joined) would wrap
    there, whatever the op, and runs in PyTorch."""
    if runtime != "openvino" or getattr(node_value_meta(node), "dtype", None) != torch.int64:
        return None
    found = value_range(node)
    if found is None or inside(found, INT32_RANGE):
        return None
    return (
        f"{op} on torch.int64 stays in PyTorch on openvino: its values reach "
        f"[{found[0]}, {found[1]}], past the int32 OpenVINO computes int64 as"
    )
