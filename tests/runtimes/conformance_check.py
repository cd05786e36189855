"""What the conformance tests share: compiling a function onto one CPU runtime, and the
comparison of its outputs with eager's that a row of the table promises
(:mod:`embedl_dynamo.runtimes.conformance`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from embedl_dynamo.runtimes.conformance import FLOAT_ATOL, FLOAT_RTOL, Verdict

__all__ = ["assert_conforms", "compile_on", "flat"]


def compile_on(fn: Callable[..., Any], runtime: str, fallback: str = "raise") -> Callable[..., Any]:
    """``fn`` compiled for ``runtime`` (static shapes, one op is enough for a subgraph)."""
    backend = "embedl_openvino" if runtime == "openvino" else "embedl_onnxruntime"
    options = {"runtime": runtime, "min_subgraph_size": 1, "fallback": fallback}
    return torch.compile(fn, backend=backend, options=options, dynamic=False)


def flat(out: Any) -> list[Any]:
    """The tensors (and numbers) of a nested output, in order."""
    if isinstance(out, (tuple, list)):
        return [x for item in out for x in flat(item)]
    return [out]


def assert_conforms(expected: Any, actual: Any, verdict: Verdict, what: str = "") -> None:
    """``actual`` as ``verdict`` promises against eager's ``expected``: the same structure,
    dtypes and shapes; integers and bools bit for bit; floats bit for bit (``exact``) or within
    the bound (``bounded``), with NaN and infinities where eager has them."""
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
        if not e.is_floating_point() or verdict is Verdict.EXACT:
            same = torch.equal(a, e) or (e.is_floating_point() and _same_floats(a, e, 0.0))
            assert same, f"{where}: {a} != eager {e}"
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
