"""Compiled over eager on the zoo (``zoo_speed``): each model's call, eager and through each
CPU target's dynamo backend, with the default options, timed by the one timer, interleaved.

The models are the test suite's zoo (``tests/zoo``, random init; ``--models`` picks some),
the targets ``--backends``. Each row's ratio is eager's time over the compiled call's; the
summary line is their geometric mean per target, the figure issue 50 holds to "no slower than
main". To compare two checkouts, run the probe in each (``PYTHONPATH`` at the checkout) and
``python -m bench compare`` the two records.
"""

from __future__ import annotations

import argparse
import math

import torch

from bench.harness.measure import one_line
from bench.harness.record import Record
from bench.harness.table import by_variant
from bench.harness.timer import interleaved
from bench.suites.common import built_models, split_names
from bench.variants.ours import compile_ours

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "eager"


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--models", default="", help="comma-separated (default: tests/zoo)")
    parser.add_argument("--backends", default="onnxruntime,openvino", help="CPU targets")
    parser.add_argument("--rounds", type=int, default=5)


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN, two rounds."""
    args.models, args.rounds = "tiny_cnn", 2


def run(args: argparse.Namespace, record: Record) -> None:
    """Per model: eager and each target's compiled call, interleaved."""
    for name, model, inputs in built_models(args.models, record):
        calls = {"eager": lambda m=model, i=inputs: m(*i)}
        for backend in split_names(args.backends):
            try:
                compiled = compile_ours(model, inputs, {}, backend=f"embedl_{backend}")
            except Exception as error:  # a compile that fails is the row's result
                record.fail(name, backend, one_line(error))
                continue
            calls[backend] = compiled.call
        timings = interleaved(calls, args.rounds, mode=torch.inference_mode)
        for variant in calls:
            record.add(name, variant, "latency", timings.median(variant) * 1e3, "ms")
        print(f"{name}: done", flush=True)
        torch._dynamo.reset()


def geometric_speedups(record: Record) -> dict[str, float]:
    """Per target: the geometric mean over models of eager's time over the compiled call's."""
    eager = {r["model"]: r["value"] for r in record.find(variant="eager", metric="latency")}
    logs: dict[str, list[float]] = {}
    for row in record.find(metric="latency"):
        if row["variant"] != "eager" and row["value"] and eager.get(row["model"]):
            logs.setdefault(row["variant"], []).append(math.log(eager[row["model"]] / row["value"]))
    return {variant: math.exp(sum(v) / len(v)) for variant, v in logs.items()}


def table(record: Record, view: str = "main") -> str:
    """A line per model (each target's time over eager's), then the geometric means."""
    means = ", ".join(f"{v} {s:.3f}x" for v, s in sorted(geometric_speedups(record).items()))
    return f"{by_variant(record, 'latency')}\n\nEager over compiled, geometric mean: {means}"
