"""Helpers shared by the tests: output comparisons, Dynamo capture with the library's own freeze,
and a plan printout that does not pin FX node names."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.graph.freeze import freeze
from embedl_dynamo.rewrite.plan import TransformationPlan

__all__ = [
    "assert_close_to_scale",
    "assert_same_outputs",
    "dynamo_frozen",
    "max_abs_diff",
    "plan_table",
]


def max_abs_diff(expected: Any, actual: Any) -> float:
    """max |expected - actual| over a tensor or (nested) tuples/lists of tensors."""
    if isinstance(expected, (tuple, list)):
        return max(max_abs_diff(e, a) for e, a in zip(expected, actual, strict=True))
    if isinstance(actual, (tuple, list)):
        (actual,) = actual
    return (expected - actual).detach().abs().max().item()


def assert_same_outputs(
    model: nn.Module, transformed: nn.Module, *args: torch.Tensor, atol: float = 1e-5
) -> None:
    """A float rewrite keeps the outputs: max abs difference <= ``atol`` (1e-5)."""
    with torch.no_grad():
        diff = max_abs_diff(model(*args), transformed(*args))
    assert diff <= atol, f"max abs diff {diff:.3g} > {atol:g}"


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-4) -> None:
    """max |a - e| <= rtol * max|e| (1e-4 relative to the output scale)."""
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max())
    err = float((actual - expected).abs().max())
    assert err <= rtol * max(scale, 1e-6), f"max abs diff {err:.3g} vs scale {scale:.3g}"


def dynamo_frozen(
    model: nn.Module, *args: torch.Tensor, dynamic: bool = False
) -> tuple[fx.GraphModule, list[Any]]:
    """The one graph Dynamo captures of ``model(*args)``, frozen by the library's :func:`freeze`.

    Returns:
        The frozen GraphModule and the inputs it still takes (user inputs, maybe sizes).
    """
    captured: list[tuple[fx.GraphModule, list[Any]]] = []

    def backend(gm: fx.GraphModule, inputs: list[Any], **_: Any):
        frozen = freeze(gm, inputs)  # now: Dynamo drops the placeholders' sources later
        captured.append((frozen.gm, [inputs[i] for i in frozen.user_inputs]))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=dynamic)(*args)
    assert len(captured) == 1, "expected one graph (no graph breaks)"
    return captured[0]


def plan_table(plan: TransformationPlan) -> str:
    """``print(plan)`` without the FX node column: id, pattern, apply, reason per entry."""
    rows = [("id", "pattern", "apply", "reason")]
    for e in plan.entries:
        state = "applied" if e.applied else ("yes" if e.apply else "no")
        rows.append((e.id, e.pattern.name, state, e.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
