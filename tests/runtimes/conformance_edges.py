"""The edge values of the conformance sweep (``test_conformance.py``): the ways a sample batch
is refilled, keeping its shapes, with the values where runtimes compute otherwise than
PyTorch (issue 50, section 2).

* floats: NaN, +inf, -inf and -0.0 at one position of every tensor at once; ties (all ones);
* integers: each dtype's extremes, and +-2**7, 2**8, 2**15, 2**24 (+1, +3), 2**31 (-1) and
  2**53 (+1) where the dtype holds them. The tensors of a batch get the value and, every
  second tensor, the value one step towards zero, so that two operands above 2**24 differ by
  one, which a comparison through float32 cannot tell apart (OpenVINO's);
* bools: all true, all false;
* empty tensors: each sample's input emptied along its first axis, where PyTorch takes that
  (:func:`emptied`).

CI tries the first, the last and a seeded position of each tensor (:data:`CI_POSITIONS`) and
the integers where float32, int32 and float64 lose them (:data:`CI_INT_EDGES`); the ``slow``
run seventeen more positions (:data:`SLOW_POSITIONS`), every integer of :data:`INT_EDGES`
and empty inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

__all__ = [
    "CI_INT_EDGES",
    "CI_POSITIONS",
    "INT_EDGES",
    "SLOW_POSITIONS",
    "edge_calls",
    "edge_fills",
    "emptied",
]

NAN, INF = float("nan"), float("inf")
#: the integer magnitudes tried (both signs), where the dtype holds them
INT_EDGES = (2**7, 2**8, 2**15, 2**24, 2**24 + 1, 2**24 + 3, 2**31 - 1, 2**31, 2**53, 2**53 + 1)
#: those CI tries: where float32 (2**24), int32 (2**31) and float64 (2**53) lose integers
CI_INT_EDGES = (2**24 + 1, 2**31 - 1, 2**53 + 1)
#: the positions CI fills: the first, the last, a seeded one (taken modulo the size)
CI_POSITIONS = (0, -1, 7919)
#: the positions the slow run fills
SLOW_POSITIONS = (*range(16), -1, -2, 7919, 104729)

Fill = Callable[[torch.Tensor, int, int], torch.Tensor]


def _at(value: float) -> Fill:
    """``value`` at position ``k`` (modulo the size) of the ``i``-th tensor; for an integer
    value, every second tensor gets the value one step towards zero."""

    def fill(t: torch.Tensor, k: int, i: int) -> torch.Tensor:
        t = t.clone()
        if t.numel():  # by index: a sample may be non-contiguous (cat's)
            v = value
            if isinstance(value, int) and i % 2:
                v = value - 1 if value > 0 else value + 1
            t[torch.unravel_index(torch.tensor(k % t.numel()), t.shape)] = v
        return t

    return fill


def _int_values(dtype: torch.dtype, magnitudes: tuple[int, ...]) -> list[int]:
    """The integer edge values ``dtype`` holds: its extremes, then ``magnitudes``, both signs."""
    info = torch.iinfo(dtype)
    values = [info.max, info.min]
    for v in magnitudes:
        values += [x for x in (v, -v) if info.min <= x <= info.max and x not in values]
    return values


def edge_fills(dtype: torch.dtype, slow: bool = False) -> list[tuple[str, Fill]]:
    """Named ways to refill a tensor of ``dtype`` with edge values (the slow run's integers:
    every magnitude of :data:`INT_EDGES`, CI's :data:`CI_INT_EDGES`); ``k`` picks a position,
    ``i`` is the tensor's place in the batch. A name ending in `` at`` is tried at each
    position."""
    ties: list[tuple[str, Fill]] = [("ties", lambda t, k, i: torch.ones_like(t))]
    if dtype.is_floating_point:
        return [(f"{v} at", _at(v)) for v in (NAN, INF, -INF, -0.0)] + ties
    if dtype == torch.bool:
        return [
            ("all true", lambda t, k, i: torch.ones_like(t)),
            ("all false", lambda t, k, i: torch.zeros_like(t)),
        ]
    info = torch.iinfo(dtype)
    magnitudes = INT_EDGES if slow else CI_INT_EDGES
    fills = [(f"{v} at", _at(v)) for v in _int_values(dtype, magnitudes)] + ties
    fills.append(("extremes", lambda t, k, i: torch.full_like(t, info.max if k % 2 else info.min)))
    if dtype == torch.int64:
        fills.append(("above 2**53", lambda t, k, i: torch.full_like(t, 2**53 + 1 + k)))
    return fills


def edge_calls(
    tensors: list[torch.Tensor], dtype: torch.dtype, slow: bool = False
) -> Iterator[tuple[str, list[torch.Tensor]]]:
    """The sample batch refilled with edge values: each fill at each position (CI's or the
    slow run's) of every tensor of ``dtype`` at once (the others, weights of another dtype,
    indices, as they were)."""
    positions = SLOW_POSITIONS if slow else CI_POSITIONS
    for name, fill in edge_fills(dtype, slow):
        ks = positions if name.endswith(" at") else range(2 if name == "extremes" else 1)
        for k in ks:
            yield (
                f"{name} {k}",
                [fill(t, k, i) if t.dtype == dtype else t for i, t in enumerate(tensors)],
            )


def emptied(op: Callable[..., Any], samples: list[Any]) -> list[Any]:
    """The samples whose input PyTorch also takes emptied along its first axis, so emptied
    (an empty list: none does)."""
    out = []
    for s in samples:
        x = s.input
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 0:
            continue
        sample = SimpleNamespace(input=x[:0].clone(), args=s.args, kwargs=s.kwargs)
        try:
            op(sample.input, *sample.args, **sample.kwargs)
        except (AssertionError, IndexError, RuntimeError, ValueError):
            continue  # PyTorch refuses it (embedding asserts its padding_idx): not a sample
        out.append(sample)
    return out
