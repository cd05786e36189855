"""What the suites and probes share besides the timer: inputs, outputs and their comparison.

Random calibration batches and batched inputs shaped like a model's examples, the first output
tensor of a model (a tensor, tuple, dict or Hugging Face output), cosine similarity in float64,
this process's resident memory, and an exception as a one-line table cell.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["batched", "calibration_batches", "cosine", "first_tensor", "one_line", "resident_gb"]


def calibration_batches(inputs: Sequence[torch.Tensor], count: int = 4) -> list[tuple]:
    """``count`` random batches shaped like ``inputs`` (normal floats; integers in [0, 1000),
    token ids), drawn from torch's global generator: seed it first for the same batches."""
    batches = []
    for _ in range(count):
        batch = []
        for x in inputs:
            if x.dtype.is_floating_point:
                batch.append(torch.randn_like(x))
            else:
                batch.append(torch.randint_like(x, 0, 1000))
        batches.append(tuple(batch))
    return batches


def batched(inputs: Sequence[torch.Tensor], batch: int) -> tuple[torch.Tensor, ...]:
    """Random inputs like ``inputs`` with batch size ``batch`` (``inputs`` themselves at their
    own batch size); integers (token ids) in [0, 1000)."""
    if all(x.shape[0] == batch for x in inputs):
        return tuple(inputs)
    return tuple(
        torch.randn(batch, *x.shape[1:], dtype=x.dtype)
        if x.dtype.is_floating_point
        else torch.randint(0, 1000, (batch, *x.shape[1:]), dtype=x.dtype)
        for x in inputs
    )


def first_tensor(out):
    """The first tensor of a model's output (a tensor, a tuple, a dict or an HF ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "last_hidden_state"):
        return out["last_hidden_state"] if "last_hidden_state" in out else next(iter(out.values()))
    return first_tensor(out[0])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened, in float64."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def resident_gb() -> float | None:
    """This process's resident memory in GB now, after a garbage collection (None where
    ``/proc/self/statm`` does not exist)."""
    gc.collect()
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**30, 2)


def one_line(exc: BaseException, limit: int = 80) -> str:
    """An exception as a table cell: its type and the first line of its message, shortened."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit]}" if lines else type(exc).__name__
