"""What the benchmarks share: random calibration batches, the first output tensor of a model,
cosine similarity, our backend compiled and called once (the compile timed), the INT8 fraction
of a compile report's layers, a failure as a one-line table cell, the resident memory, and
round-robin timing in one process.

``round_robin_medians`` calls each variant three times per round and times the last two, after
a 50 ms pause (one ONNX Runtime or OpenVINO session's spinning worker threads must not bill the
next variant; eager PyTorch suffers most), and rotates the order each round (the variant right
after eager PyTorch runs measurably faster here, an order effect every variant should share).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from embedl_dynamo.report.compile_report import CompileReport

__all__ = [
    "Compiled",
    "calibration_batches",
    "compile_ours",
    "cosine",
    "first_tensor",
    "int8_layer_fraction",
    "one_line",
    "resident_gb",
    "round_robin_medians",
]


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


@dataclass
class Compiled:
    """Our backend's compile of a model, called once.

    Attributes:
        call: the call to time (the compiled model on the example inputs).
        output: the first output tensor of the first call.
        first_s: seconds of the first call (compile included).
        report: the compile report of that call.
    """

    call: Callable[[], object]
    output: torch.Tensor
    first_s: float
    report: CompileReport


def compile_ours(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    options: dict[str, Any],
    backend: str = "embedl_tensorrt",
) -> Compiled:
    """``torch.compile(model, backend=backend, options=options)`` called once on ``inputs``
    under ``torch.no_grad`` (the mode :func:`round_robin_medians` times in).

    Dynamo is not reset here: a reset makes every earlier compile of the same model compile
    again on its next call, so callers that time several compiles together reset only after.
    """
    import embedl_dynamo

    embedl_dynamo.clear_reports()
    compiled = torch.compile(model, backend=backend, options=options)
    start = time.perf_counter()
    with torch.no_grad():
        output = first_tensor(compiled(*inputs))
    first_s = time.perf_counter() - start
    return Compiled(lambda: compiled(*inputs), output, first_s, embedl_dynamo.last_report())


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
