"""Op conformance against PyTorch's own samples (issue 39): every op of the conformance table
(:mod:`embedl_dynamo.runtimes.conformance`) runs on each CPU runtime on its OpInfo samples
(``op_db``, the samples ``torch.onnx``'s op-consistency tests use), then, on the same compiled
graph, on the samples refilled with edge values: NaN and +-inf at each position, ties, each
integer dtype's extremes, int64 above 2**53. Its row is the expected result: ``exact`` and
``bounded`` ops run on the runtime and match eager as the row promises; ``kept`` ops stay in
PyTorch, with the row's reason.

All samples of an op and dtype are one graph, one compile (a sample the runtime refuses
outright, an export or build error, is found by halving and left to PyTorch). CI runs the
entries of :data:`CI_OPINFO` in float32 and int64; ``-m slow`` runs every other entry and every
dtype of :data:`ALL_DTYPES`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import (
    NON_FINITE_EDGES,
    ROWS,
    Verdict,
    differences,
    rule_for,
)
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import assert_conforms, compile_on

NAN, INF = float("nan"), float("inf")
CI_DTYPES = (torch.float32, torch.int64)
# the OpInfo entries CI runs (float32 and int64): the reductions and activations whose edge
# values differed, indexing and the comparisons OpenVINO answers otherwise for NaN; every
# other entry and dtype is marked slow
CI_OPINFO = frozenset(
    {"argmax", "max.reduction_with_dim", "amax", "sum", "topk", "softmax", "nn.functional.relu",
     "add", "cumsum", "__getitem__", "gt"}
)  # fmt: skip
ALL_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool)
MAX_SAMPLES = 24  # per op and dtype (max_pool2d has 1,440)
RUNTIMES = ("onnxruntime", "openvino")


def _no_op() -> None:
    return None


@functools.cache
def _op_db() -> dict[str, Any]:
    # importing PyTorch's test utilities freezes torch.backends' global flags for the rest of
    # the process (common_utils calls disable_global_flags): tests after this one in the same
    # worker set them (tests/graph/test_float32.py), so the import must leave them as they are
    frozen, torch.backends.disable_global_flags = torch.backends.disable_global_flags, _no_op
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    finally:
        torch.backends.disable_global_flags = frozen
    return {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}


def _cases(dtypes: tuple[torch.dtype, ...]) -> Iterator[Any]:
    for row in ROWS:
        for name in row.opinfo:
            for runtime in RUNTIMES:
                for dtype in dtypes:
                    if rule_for(row.op, runtime, dtype) is None:
                        continue  # the row does not speak for this dtype
                    marks = ()
                    if runtime == "openvino" and not OpenVINORuntime.is_available():
                        marks = (pytest.mark.skip(reason="no openvino"),)
                    ident = f"{name}-{runtime}-{str(dtype).removeprefix('torch.')}"
                    yield pytest.param(row.op, name, runtime, dtype, id=ident, marks=marks)


class _Slot:
    """Where the ``index``-th tensor goes in a sample's arguments."""

    def __init__(self, index: int) -> None:
        self.index = index


def _batch(samples: list[Any]) -> tuple[list[torch.Tensor], list[tuple[Any, tuple, dict]]]:
    """The samples' tensors as one flat list, and each sample with slots in their place."""
    tensors: list[torch.Tensor] = []

    def slot(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x.clone())
            return _Slot(len(tensors) - 1)
        if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
            return type(x)(slot(v) for v in x)  # cat's and stack's list of tensors
        return x

    specs = []
    for s in samples:
        specs.append(
            (slot(s.input), tuple(map(slot, s.args)), {k: slot(v) for k, v in s.kwargs.items()})
        )
    return tensors, specs


def _batched_fn(op: Callable[..., Any], specs: list[tuple[Any, tuple, dict]]) -> Callable[..., Any]:
    def fill(x: Any, tensors: tuple) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(fill(v, tensors) for v in x)
        return tensors[x.index] if isinstance(x, _Slot) else x

    def fn(*tensors: torch.Tensor) -> tuple[Any, ...]:
        # each output a new tensor: a view of an input (flatten) would keep it in PyTorch
        return tuple(
            _cloned(op(fill(i, tensors), *(fill(a, tensors) for a in args),
                       **{k: fill(v, tensors) for k, v in kwargs.items()}))
            for i, args, kwargs in specs
        )  # fmt: skip

    return fn


def _cloned(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    return tuple(_cloned(o) for o in out) if isinstance(out, tuple) else out


def _edge_fills(
    dtype: torch.dtype,
) -> list[tuple[str, Callable[[torch.Tensor, int], torch.Tensor]]]:
    """Named ways to refill a tensor (keeping its shape) with edge values; ``k`` picks a
    position."""

    def at(value: float) -> Callable[[torch.Tensor, int], torch.Tensor]:
        def fill(t: torch.Tensor, k: int) -> torch.Tensor:
            t = t.clone()
            if t.numel():  # by index: a sample may be non-contiguous (cat's)
                t[torch.unravel_index(torch.tensor(k % t.numel()), t.shape)] = value
            return t

        return fill

    ties = [("ties", lambda t, k: torch.ones_like(t))]
    if dtype.is_floating_point:
        return [(f"{v} at", at(v)) for v in (NAN, INF, -INF)] + ties
    if dtype == torch.bool:
        return [
            ("all true", lambda t, k: torch.ones_like(t)),
            ("all false", lambda t, k: torch.zeros_like(t)),
        ]
    info = torch.iinfo(dtype)
    fills = [(f"{v} at", at(v)) for v in (info.max, info.min)] + ties
    fills.append(("extremes", lambda t, k: torch.full_like(t, info.max if k % 2 else info.min)))
    if dtype == torch.int64:
        fills.append(("above 2**53", lambda t, k: torch.full_like(t, 2**53 + 1 + k)))
    return fills


def _edge_calls(
    tensors: list[torch.Tensor], dtype: torch.dtype
) -> Iterator[tuple[str, list[torch.Tensor]]]:
    """The sample batch refilled with edge values: each fill at positions 0..5 of every
    tensor of the sample's dtype (the others, weights of another dtype, indices, as they were)."""
    for name, fill in _edge_fills(dtype):
        positions = range(6) if name.endswith(" at") else range(2 if name == "extremes" else 1)
        for k in positions:
            label = f"{name} {k}"
            yield label, [fill(t, k) if t.dtype == dtype else t for t in tensors]


def _expect_runs_on(runtime: str, tensors: list[torch.Tensor]) -> bool:
    return not (runtime == "openvino" and any(
        t.dtype == torch.int64 and t.numel() and (t.min() < -(2**31) or t.max() >= 2**31)
        for t in tensors
    ))  # fmt: skip


def _compile_parts(
    info: Any, samples: list[Any], runtime: str
) -> tuple[list[tuple[Callable[..., Any], list[torch.Tensor], Any]], list[str]]:
    """The samples compiled as few graphs as the runtime takes: ``(fn, tensors, compiled)``
    per graph that ran on it, and the reasons of the samples it refused outright (an export
    or build error: loud, so such a graph runs in PyTorch; halving finds them)."""
    tensors, specs = _batch(samples)
    fn = _batched_fn(info.op, specs)
    torch._dynamo.reset()  # every part is a new graph of the same code object
    compiled = compile_on(fn, runtime, fallback="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = compiled(*tensors)
    assert_conforms(fn(*tensors), actual, Verdict.BOUNDED, f"{info.name} on {runtime}")
    reports = last_report().subgraphs
    if {r.runtime for r in reports} == {runtime} or not _expect_runs_on(runtime, tensors):
        return [(fn, tensors, compiled)], []
    refused = [r.reason for r in reports if r.runtime != runtime]
    # an export or build error, or a float64 value, which OpenVINO computes as float32 (the
    # compile keeps such a graph in PyTorch: judge._float64_on_openvino): halve and go on
    expected = ("failed", "which OpenVINO computes as float32")
    assert all(any(e in r for e in expected) for r in refused), (
        f"{info.name} did not run on {runtime}: {refused}"
    )
    if len(samples) == 1:
        return [], refused
    half = len(samples) // 2
    first, first_refused = _compile_parts(info, samples[:half], runtime)
    second, second_refused = _compile_parts(info, samples[half:], runtime)
    return first + second, first_refused + second_refused


def _check(op: str, name: str, runtime: str, dtype: torch.dtype) -> None:
    info = _op_db()[name]
    if dtype not in info.supported_dtypes("cpu"):
        pytest.skip(f"PyTorch's {name} does not take {dtype}")
    samples = info.sample_inputs("cpu", dtype, requires_grad=False)
    # a sample that trains (batch_norm's training=True) runs eagerly by design, and one with
    # embedding's max_norm is another op (embedding_renorm_, no row): not this row's samples
    samples = [s for s in samples if not s.kwargs.get("training") and "max_norm" not in s.kwargs]
    samples = samples[:MAX_SAMPLES]
    if not samples:
        pytest.skip(f"no sample of {name} for {dtype}")
    rule = rule_for(op, runtime, dtype)
    if rule.verdict is Verdict.KEPT:
        tensors, specs = _batch(samples)
        fn = _batched_fn(info.op, specs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compile_on(fn, runtime, fallback="eager")(*tensors)
        assert_conforms(fn(*tensors), actual, rule.verdict, f"{name} on {runtime}")
        for report in last_report().subgraphs:  # the op stays in PyTorch, alone or with its graph
            why = (
                [report.reason] if report.runtime == "eager" else [k["reason"] for k in report.kept]
            )
            assert any(rule.reason in w for w in why), f"{name} ran on {runtime}: {report}"
        return
    parts, refused = _compile_parts(info, samples, runtime)
    if not parts:  # loud (an export or build error): every such graph runs in PyTorch
        pytest.skip(f"{runtime} refuses every sample of {name} in {dtype}: {refused[0][:200]}")
    # a difference on NaN or infinities is behind the per-call guard (dynamo/call_guards): such
    # calls run in PyTorch, so they must conform as every other call does
    differs = {d.edge for d in differences(op, runtime)} - set(NON_FINITE_EDGES)
    shown: set[str] = set()
    for fn, tensors, compiled in parts:
        for label, edge in _edge_calls(tensors, dtype):
            try:
                expected = fn(*(t.clone() for t in edge))  # eager may write (max_norm)
            except (IndexError, RuntimeError):
                continue  # PyTorch refuses the values (an index out of range): no sample
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                actual = compiled(*edge)
            known = next((d for d in differs if label.startswith(d)), None)
            try:
                assert_conforms(expected, actual, rule.verdict, f"{name} on {runtime}, {label}")
            except AssertionError:
                if known is None:
                    raise
                shown.add(known)


_CI_CASES = [c for c in _cases(CI_DTYPES) if c.values[1] in CI_OPINFO]


@pytest.mark.parametrize(("op", "name", "runtime", "dtype"), _CI_CASES)
def test_op_conforms(op, name, runtime, dtype):
    _check(op, name, runtime, dtype)


# open findings of the slow run, not yet explained or fixed (issue 39, item 2: dtypes)
_FLOAT64 = pytest.mark.xfail(
    reason="float64: an output computed from a 0-d float64 input alone comes back float32 "
    "(f(x, s) = (x + s, s * 2): the second output), and OpenVINO gives +-3.4e38 for +-inf; open",
    strict=False,
)


def _slow_cases() -> list[Any]:
    ci = {c.id for c in _CI_CASES}
    cases = [c for c in _cases(ALL_DTYPES) if c.id not in ci]
    return [
        pytest.param(*c.values, id=c.id, marks=(*c.marks, _FLOAT64))
        if c.values[3] == torch.float64
        else c
        for c in cases
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("op", "name", "runtime", "dtype"), _slow_cases())
def test_op_conforms_slow(op, name, runtime, dtype):
    _check(op, name, runtime, dtype)
