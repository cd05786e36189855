"""Latency measurement helpers shared by ``embedl-dynamo bench``, ``bench/`` and the examples.

Timing rule: warm up (first calls compile, allocate and fill caches), then time each call
separately with ``time.perf_counter`` and report the *median*, which one slow call from a busy
machine does not move. Ratios between variants are only meaningful within one run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.tuning.judge import flat_outputs

__all__ = ["Measurement", "format_table", "measure", "plot_latencies"]


@dataclass(frozen=True)
class Measurement:
    """One variant's timings.

    Attributes:
        name: the variant (``eager``, ``embedl float`` ...).
        times_ms: per-call latencies after warm-up, in milliseconds.
        first_call_s: the first call (compilation included), in seconds.
        max_abs_diff: max abs difference of its output to the reference (None for the reference).
    """

    name: str
    times_ms: tuple[float, ...]
    first_call_s: float
    max_abs_diff: float | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p90_ms(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def measure(
    name: str,
    fn: Callable[..., Any],
    args: Sequence[torch.Tensor],
    *,
    warmup: int = 3,
    repeats: int = 20,
    reference: Sequence[torch.Tensor] | None = None,
) -> Measurement:
    """Time ``fn(*args)``: the first call, ``warmup`` more, then ``repeats`` timed calls.

    Args:
        name: the variant's name.
        fn: the callable (a model, a compiled model).
        args: its inputs.
        warmup: untimed calls after the first.
        repeats: timed calls (at least 1).
        reference: outputs to compare the first call's output with.

    Returns:
        A :class:`Measurement`.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    with torch.no_grad():
        start = time.perf_counter()
        out = fn(*args)
        first = time.perf_counter() - start
        diff = None
        if reference is not None:
            diff = max(
                float((a.float() - b.float()).abs().max())
                for a, b in zip(flat_outputs(out), reference)
            )
        for _ in range(warmup):
            fn(*args)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - start) * 1e3)
    return Measurement(name, tuple(times), first, diff)


def format_table(measurements: Sequence[Measurement], baseline: str | None = None) -> str:
    """A text table: median, p90, ratio to ``baseline`` (the first row when None), first call."""
    if not measurements:
        return "(nothing measured)"
    base = next((m for m in measurements if m.name == baseline), measurements[0])
    header = ("variant", "median ms", "p90 ms", f"x {base.name}", "first call s", "max |diff|")
    rows = [
        (
            m.name,
            f"{m.median_ms:.2f}",
            f"{m.p90_ms:.2f}",
            f"{m.median_ms / base.median_ms:.2f}",
            f"{m.first_call_s:.2f}",
            "-" if m.max_abs_diff is None else f"{m.max_abs_diff:.2e}",
        )
        for m in measurements
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def plot_latencies(measurements: Sequence[Measurement], path: str | Path, title: str = "") -> Path:
    """A PNG bar chart of median latencies (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [m.name for m in measurements]
    medians = [m.median_ms for m in measurements]
    bars = ax.bar(names, medians, color=["#888888", "#2b7bba", "#e07b39", "#4caf50"][: len(names)])
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in medians])
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title or "latency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
