"""What the benchmarks share: the first output tensor of a model, cosine similarity, and
round-robin timing in one process.

``round_robin_medians`` calls each variant three times per round and times the last two, after
a 50 ms pause (one ONNX Runtime or OpenVINO session's spinning worker threads must not bill the
next variant; eager PyTorch suffers most), and rotates the order each round (the variant right
after eager PyTorch runs measurably faster here, an order effect every variant should share).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["cosine", "first_tensor", "round_robin_medians"]


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


def round_robin_medians(
    fns: Mapping[str, Callable[[], object]],
    rounds: int,
    mode: Callable[[], Any] = torch.no_grad,
) -> dict[str, float]:
    """Median seconds per call of each variant, timed round-robin (see the module docstring).

    ``mode`` is the grad mode the variants were compiled under (Dynamo guards on it).
    """
    samples: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    with mode():
        for round_ in range(rounds):
            for key in keys[round_ % len(keys) :] + keys[: round_ % len(keys)]:
                time.sleep(0.05)
                for call in range(3):
                    start = time.perf_counter()
                    fns[key]()
                    if call:
                        samples[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in samples.items()}
