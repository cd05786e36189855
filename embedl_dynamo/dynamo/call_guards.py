"""Per-call guards on a runtime's infer: the calls it would answer otherwise than PyTorch go to
PyTorch instead.

A guard raises :class:`~embedl_dynamo.errors.CallRefused` before (or instead of) handing back an answer the runtime
computes otherwise; the compiled call (:func:`~embedl_dynamo.dynamo.compiled_call.wrap_compiled`)
then runs that call in PyTorch, with one warning per subgraph, as for any call a runtime fails.

* **non-finite inputs**: a graph holding an op whose conformance row lists a difference on
  NaN or infinities for the runtime that runs it
  (:func:`~embedl_dynamo.runtimes.conformance.needs_finite_inputs`: OpenVINO's ReLU and clamp
  give 0 for NaN, convolution and pooling windows spread or drop them) refuses a call whose
  float inputs hold one. One pass over each float input (a min and a max).
* **indices**: a graph whose index ops PyTorch would refuse on some values (a negative token
  id, a position past the table) carries one more output saying so
  (:mod:`embedl_dynamo.graph.index_guards`); a call that sets it is refused, and PyTorch
  raises its own error.
* **INT8**: an artifact that runs INT8 layers refuses NaN and infinities, which QuantizeLinear
  turns into finite codes (:func:`guard_int8`).
* **half overflow**: an fp16/bf16 artifact whose outputs hold NaN or an infinity where its
  inputs held none overflowed where PyTorch's float graph may not (fp16 ends at 65504): the
  call is refused, and PyTorch answers it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.errors import CallRefused
from embedl_dynamo.graph.index_guards import IndexGuard
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.conformance import needs_finite_inputs
from embedl_dynamo.runtimes.finite import all_finite
from embedl_dynamo.settings import Settings

__all__ = [
    "guard_call",
    "guard_finite_inputs",
    "guard_half_overflow",
    "guard_int8",
    "runs_int8",
]


def _first_non_finite(tensors: Sequence[Any]) -> int | None:
    for position, tensor in enumerate(tensors):
        if isinstance(tensor, torch.Tensor) and not all_finite(tensor):
            return position
    return None


class _Guarded:
    """``infer`` behind a check; keeps a runtime's in-place writes
    (:meth:`~embedl_dynamo.runtimes.served.Served.writing_in_place`) available."""

    def __init__(self, infer: Callable[..., Any]) -> None:
        self.infer = infer

    def writing_in_place(self, in_place: Any) -> _Guarded:
        inner = getattr(self.infer, "writing_in_place", None)
        if inner is None:
            return self
        guarded = copy.copy(self)
        guarded.infer = inner(in_place)
        return guarded


class _FiniteInputs(_Guarded):
    def __init__(self, infer: Callable[..., Any], why: str) -> None:
        super().__init__(infer)
        self.why = why

    def __call__(self, *inputs: Any) -> Any:
        position = _first_non_finite(inputs)
        if position is not None:
            raise CallRefused(f"input {position} holds NaN or infinity, and {self.why}")
        return self.infer(*inputs)


class _HalfOverflow(_Guarded):
    def __init__(self, infer: Callable[..., Any], dtype: torch.dtype) -> None:
        super().__init__(infer)
        self.name = str(dtype).removeprefix("torch.")

    def __call__(self, *inputs: Any) -> Any:
        outputs = self.infer(*inputs)
        flat = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        if _first_non_finite(flat) is not None and _first_non_finite(inputs) is None:
            raise CallRefused(
                f"the {self.name} artifact gave NaN or infinity from finite inputs (it "
                "overflowed); PyTorch answers such calls"
            )
        return outputs


class _Indices(_Guarded):
    def __init__(self, infer: Callable[..., Any], guard: IndexGuard) -> None:
        super().__init__(infer)
        self.guard = guard

    def __call__(self, *inputs: Any) -> Any:
        return self.guard.split(self.infer(*inputs))


def guard_finite_inputs(infer: Callable[..., Any], why: str) -> Callable[..., Any]:
    """``infer`` refusing a call whose float inputs hold NaN or an infinity (``why``: what the
    runtime would compute instead)."""
    return _FiniteInputs(infer, why)


def runs_int8(settings: Settings, report: SubgraphReport) -> bool:
    """Whether the subgraph's artifact runs INT8 layers: its precision quantizes to int8, the
    pipeline quantized it (``mixed`` may keep all in float) and the INT8 artifact was not
    rejected for the float one (:attr:`~embedl_dynamo.report.subgraph.SubgraphReport.
    lower_rejected`, which a warm start reads from its alias)."""
    return (
        settings.precision.qdq_type == "int8"
        and bool(report.pipeline.get("quantized"))
        and not report.lower_rejected
    )


def guard_int8(
    infer: Callable[..., Any], settings: Settings, report: SubgraphReport
) -> Callable[..., Any]:
    """``infer`` refusing calls with NaN or infinities where it runs INT8 (:func:`runs_int8`):
    QuantizeLinear turns them into finite codes, so the artifact would answer with finite
    numbers where PyTorch gives NaN or infinities."""
    if not runs_int8(settings, report):
        return infer
    return _FiniteInputs(infer, "INT8 quantizes them to finite values")


def guard_half_overflow(infer: Callable[..., Any], dtype: torch.dtype) -> Callable[..., Any]:
    """``infer`` of a half-precision artifact refusing a call whose outputs hold NaN or an
    infinity its inputs did not: the half type overflowed where PyTorch may not."""
    return _HalfOverflow(infer, dtype)


def _finite_reason(graph: fx.GraphModule, runtime: str) -> str | None:
    """Which op of ``graph`` makes ``runtime`` need finite inputs (None: none does)."""
    for node in graph.graph.nodes:
        if needs_finite_inputs(node, runtime):
            name = getattr(node.target, "__name__", node.target)
            return f"{runtime} computes {name} otherwise than PyTorch on NaN and infinities"
    return None


def guard_call(
    infer: Callable[..., Any] | None,
    graph: fx.GraphModule,
    report: SubgraphReport,
    settings: Settings,
    index_guard: IndexGuard | None = None,
) -> Callable[..., Any] | None:
    """``infer`` (None: the graph runs in PyTorch) with the guards the runtime that runs it
    needs for ``graph``'s ops and the precision it ran at (see the module docstring);
    ``index_guard``: ``graph`` ends with the flag of :mod:`~embedl_dynamo.graph.index_guards`,
    which is taken off its outputs, and a call that sets it is refused."""
    if infer is None:
        return None
    if index_guard is not None:
        infer = _Indices(infer, index_guard)
    infer = guard_int8(infer, settings, report)  # NaN and inf would quantize to finite codes
    half = settings.precision.half_dtype
    if half is not None:  # a float artifact that ran instead never trips it
        infer = guard_half_overflow(infer, half)
    why = _finite_reason(graph, report.runtime)
    if why is not None:
        infer = guard_finite_inputs(infer, why)
    return infer
