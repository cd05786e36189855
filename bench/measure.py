"""What the benchmarks share: the first output tensor of a model, cosine similarity, the INT8
fraction of a compile report's layers, and round-robin timing in one process.

``round_robin_medians`` calls each variant three times per round and times the last two, after
a 50 ms pause (one ONNX Runtime or OpenVINO session's spinning worker threads must not bill the
next variant; eager PyTorch suffers most), and rotates the order each round (the variant right
after eager PyTorch runs measurably faster here, an order effect every variant should share).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from embedl_dynamo.report.compile_report import CompileReport

__all__ = ["cosine", "first_tensor", "int8_layer_fraction", "round_robin_medians"]


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


def int8_layer_fraction(report: CompileReport) -> str:
    """How many of the compiled layers run in INT8, as a table cell: ``"int8/all"``.

    Counts over every subgraph: the per-layer decisions of ``mixed`` where there are some, else
    the quantized and float-kept layers of ``int8``. A subgraph whose INT8 graph the accuracy
    check rejected (it runs fp32) makes the cell say so instead of a fraction.
    """
    rejected = [s for s in report.subgraphs if " rejected, fp32 runs" in s.reason]
    if rejected:
        return f"rejected ({len(rejected)} subgraph(s) run fp32)"
    layers = [r for s in report.subgraphs for r in s.pipeline.get("layers", [])]
    if layers:
        return f"{sum(r['precision'] == 'int8' for r in layers)}/{len(layers)}"
    quant = [s.pipeline.get("quantization") or {} for s in report.subgraphs]
    int8 = sum(len(q.get("quantized_layers", [])) for q in quant)
    kept = sum(len(q.get("float_layers", [])) for q in quant)
    return f"{int8}/{int8 + kept}"


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
