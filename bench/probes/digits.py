"""Precision on real data: top-1, INT8 fraction and speed of ``int8`` and ``mixed`` against float.

Trains the two models of ``tests/digits.py`` on scikit-learn's digits (1,797 real 8x8
images; a depthwise + squeeze-excite CNN and a small ViT, seconds each), compiles each with
``torch.compile(backend="embedl_tensorrt")`` under ``runtime="auto"`` at ``fp32``, ``int8`` and
``mixed`` (calibrated on 256 training images), and records held-out top-1, the INT8 fraction
of the layers, the runtime, and the latency at batch 60 as a ratio to our ``fp32``, timed by
the one timer under ``torch.inference_mode``. The unit test ``tests/tuning/test_mixed_accuracy
.py`` asserts the accuracy.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import interleaved
from bench.variants.ours import int8_layer_fraction

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "ours-fp32"
VARIANTS = ("fp32", "int8", "mixed")


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--rounds", type=int, default=20)


def smoke(args: argparse.Namespace) -> None:
    """Two rounds."""
    args.rounds = 2


def _bench(record: Record, make, epochs: int, rounds: int) -> None:
    import embedl_dynamo
    from tests.digits import accuracy, train_digits_cnn

    model, (x_train, _, x_test, y_test) = train_digits_cnn(epochs=epochs, make=make)
    name, batch, calls = make.__name__, x_test[:60], {}
    record.add(name, "eager", "top1", accuracy(model, x_test, y_test), "%")
    for precision in VARIANTS:
        torch._dynamo.reset()
        embedl_dynamo.clear_reports()
        options = {"precision": precision, "cache_dir": tempfile.mkdtemp()}
        if precision != "fp32":
            options["calibration_data"] = list(x_train[:256].split(64))
        compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
        top1 = accuracy(compiled, x_test, y_test, batch=60)
        report = embedl_dynamo.last_report()
        info = {"runtime": report.subgraphs[0].runtime}
        if precision != "fp32":
            info["int8_layers"] = int8_layer_fraction(report)
        record.add(name, f"ours-{precision}", "top1", top1, "%", info=info)
        calls[f"ours-{precision}"] = lambda c=compiled: c(batch)
    timings = interleaved(calls, rounds, mode=torch.inference_mode)
    for variant in calls:
        record.add(
            name, variant, "latency", timings.median(variant) * 1e3, "ms", params={"batch": 60}
        )


def run(args: argparse.Namespace, record: Record) -> None:
    """The depthwise CNN (6 epochs) and the ViT (12 epochs)."""
    from tests.digits import DigitsMobileCNN, DigitsViT

    _bench(record, DigitsMobileCNN, 6, args.rounds)
    _bench(record, DigitsViT, 12, args.rounds)


def table(record: Record, view: str = "main") -> str:
    """A line per model and variant: top-1, then the latency at batch 60."""
    return by_metric(record, ("top1",)) + "\n\n" + by_metric(record, ("latency",))
