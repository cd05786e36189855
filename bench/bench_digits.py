"""Precision on real data: top-1, INT8 fraction and speed of ``int8`` and ``mixed`` against float.

Trains the two models of ``tests/digits.py`` on scikit-learn's digits (1,797 real 8x8
images; a depthwise + squeeze-excite CNN and a small ViT, seconds each), compiles each with
``torch.compile(backend="embedl_tensorrt")`` under ``runtime="auto"`` at ``fp32``, ``int8`` and
``mixed`` (calibrated on 256 training images), and reports held-out top-1, the INT8 fraction of
the layers and the latency at batch 60 as a ratio to our ``fp32``, timed round-robin in this
process. The unit test ``tests/tuning/test_mixed_accuracy.py`` asserts the accuracy.

Usage::

    python bench/bench_digits.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import embedl_dynamo  # noqa: E402
from bench.measure import int8_layer_fraction, round_robin_medians  # noqa: E402
from embedl_dynamo import clear_reports  # noqa: E402
from tests.digits import DigitsMobileCNN, DigitsViT, accuracy, train_digits_cnn  # noqa: E402

VARIANTS = ("fp32", "int8", "mixed")


def bench(make, epochs: int, rounds: int) -> dict:
    model, (x_train, _, x_test, y_test) = train_digits_cnn(epochs=epochs, make=make)
    row = {"model": make.__name__, "fp32_top1": round(accuracy(model, x_test, y_test), 2)}
    batch = x_test[:60]
    fns = {}
    for precision in VARIANTS:
        torch._dynamo.reset()
        clear_reports()
        options = {"precision": precision, "cache_dir": tempfile.mkdtemp()}
        if precision != "fp32":
            options["calibration_data"] = list(x_train[:256].split(64))
        compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
        row[f"{precision}_top1"] = round(accuracy(compiled, x_test, y_test, batch=60), 2)
        report = embedl_dynamo.last_report()
        row[f"{precision}_runtime"] = report.subgraphs[0].runtime
        row[f"{precision}_int8"] = int8_layer_fraction(report) if precision != "fp32" else ""
        fns[precision] = lambda c=compiled: c(batch)
    medians = round_robin_medians(fns, rounds, torch.inference_mode)
    for precision in VARIANTS:
        row[f"{precision}_x_fp32"] = round(medians[precision] / medians["fp32"], 3)
    row["fp32_ms"] = round(medians["fp32"] * 1e3, 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [bench(DigitsMobileCNN, 6, args.rounds), bench(DigitsViT, 12, args.rounds)]
    print(
        "| model | top-1 fp32 / int8 / mixed | INT8 layers (int8; mixed) | runtime (fp32/int8/mixed) "
        "| fp32 ms (batch 60) | int8 / fp32 | mixed / fp32 |"
    )
    print("|" + "---|" * 7)
    for r in rows:
        print(
            f"| {r['model']} | {r['fp32_top1']} / {r['int8_top1']} / {r['mixed_top1']} | "
            f"{r['int8_int8']}; {r['mixed_int8']} | {r['fp32_runtime']}/{r['int8_runtime']}/"
            f"{r['mixed_runtime']} | {r['fp32_ms']} | {r['int8_x_fp32']} | {r['mixed_x_fp32']} |"
        )


if __name__ == "__main__":
    main()
