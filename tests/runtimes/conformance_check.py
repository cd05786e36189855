"""What the conformance tests share: compiling a function onto one CPU runtime, and the
comparison of its outputs with eager's that a row of the table promises
(:mod:`embedl_dynamo.runtimes.conformance`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from embedl_dynamo.runtimes.conformance import FLOAT_ATOL, FLOAT_RTOL, Verdict

__all__ = ["assert_conforms", "compile_on", "flat", "placement"]


def compile_on(fn: Callable[..., Any], runtime: str, fallback: str = "raise") -> Callable[..., Any]:
    """``fn`` compiled for ``runtime`` (static shapes, one op is enough for a subgraph)."""
    backend = "embedl_openvino" if runtime == "openvino" else "embedl_onnxruntime"
    options = {"runtime": runtime, "min_subgraph_size": 1, "fallback": fallback}
    return torch.compile(fn, backend=backend, options=options, dynamic=False)


def placement(reports: list[Any], runtime: str) -> tuple[bool, list[str]]:
    """Where a compile put its graphs: whether ``runtime`` computes some of them, and the
    reason of each part that stays in PyTorch (a subgraph that fell back whole, a fragment
    whose build failed, each node a partitioned subgraph keeps)."""
    ran, reasons = False, []
    for report in reports:
        if report.status == "partitioned":
            reasons += [k["reason"] for k in report.kept]
            parts = report.partitions
        else:
            parts = [report]
        for part in parts:
            if part.runtime == runtime:
                ran = True
            else:
                reasons.append(part.reason)
    return ran, reasons


def flat(out: Any) -> list[Any]:
    """The tensors (and numbers) of a nested output, in order."""
    if isinstance(out, (tuple, list)):
        return [x for item in out for x in flat(item)]
    return [out]


def assert_conforms(expected: Any, actual: Any, verdict: Verdict, what: str = "") -> None:
    """``actual`` as ``verdict`` promises against eager's ``expected``: the same structure,
    dtypes and shapes; integers and bools bit for bit; floats bit for bit (``exact``: the sign
    of a zero too) or within the bound (``bounded``), with NaN and infinities where eager has
    them."""
    expected, actual = flat(expected), flat(actual)
    assert len(expected) == len(actual), f"{what}: {len(actual)} outputs, eager {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        where = f"{what} output {i}"
        if not isinstance(e, torch.Tensor):
            assert e == a, f"{where}: {a!r} != eager {e!r}"
            continue
        assert isinstance(a, torch.Tensor), f"{where}: {type(a).__name__}, eager a tensor"
        assert a.dtype == e.dtype, f"{where}: dtype {a.dtype}, eager {e.dtype}"
        assert a.shape == e.shape, f"{where}: shape {tuple(a.shape)}, eager {tuple(e.shape)}"
        if not e.is_floating_point():
            assert torch.equal(a, e), f"{where}: {a} != eager {e}"
            continue
        if verdict is Verdict.EXACT:  # bit for bit: -0.0 is not 0.0
            same = _same_floats(a, e, 0.0) and torch.equal(_negative_zeros(a), _negative_zeros(e))
            assert same, f"{where}: {a} != eager {e} (bit for bit)"
            continue
        scale = e[torch.isfinite(e)].abs().max().item() if torch.isfinite(e).any() else 0.0
        assert _same_floats(a, e, max(FLOAT_ATOL, FLOAT_RTOL * scale)), (
            f"{where}: {a} differs from eager {e} beyond the bound"
        )


def _same_floats(a: torch.Tensor, e: torch.Tensor, tol: float) -> bool:
    """NaN, +inf and -inf at the same places; the finite values within ``tol``."""
    a, e = a.double(), e.double()
    for special in (torch.isnan, torch.isposinf, torch.isneginf):
        if not torch.equal(special(a), special(e)):
            return False
    finite = torch.isfinite(e)
    return bool(((a[finite] - e[finite]).abs() <= tol).all())


def _negative_zeros(x: torch.Tensor) -> torch.Tensor:
    """Where ``x`` holds -0.0 (the sign of a NaN is not compared)."""
    return (x == 0) & x.signbit()
