"""Float, INT8 and mixed precision across architecture families, against eager, in one run.

For each model of :data:`bench.zoo.ZOO` (random weights, BatchNorm statistics settled on random
batches, batch 1): eager PyTorch; our float (``precision="fp32"``), ``int8`` and ``mixed``
through ``torch.compile(backend="embedl_tensorrt")`` with ``runtime="auto"`` (on this CPU: the
faster of OpenVINO and ONNX Runtime for float, OpenVINO for INT8, each with its own placement),
calibrated on 4 random batches; and, where ``nncf`` is installed, the INT8 peer NNCF + OpenVINO
on the same batches. Latencies are medians timed round-robin in this process (each variant
called three times per round and the last two timed, after a 50 ms pause, so one runtime's
spinning worker threads do not bill the next; the order rotates each round), reported as ratios
to eager; cosine similarity of the outputs to eager; the INT8 fraction of the layers ``mixed``
and ``int8`` run; first-call seconds (cold: a fresh cache directory per model).

With ``--bf16`` (issue 25): eager, OpenVINO's own default (``ov.convert_model`` compiled with
its default hints: bf16 on a CPU with AVX512_BF16 or AMX), and our ``precision="bf16"`` on the
``openvino`` runtime in each form, forced (the typed graph; the f32 graph with the bf16 hint)
and as chosen (:mod:`embedl_dynamo.tuning.half_form`, whose report line is shown), timed
round-robin in one process, as ratios to eager, with cosines to eager.

Targets (issue 9): ``int8``/``mixed`` never slower than our float beyond noise (<= 1.03x);
geometric mean of ``mixed`` <= 0.6x our float; cosine >= 0.99 on every CNN; no NaN; BERT-base
INT8 within 1.5x of NNCF + OpenVINO INT8.

Usage::

    pip install -c constraints.txt -e ".[bench]" nncf
    python bench/bench_precision.py [--models resnet50,bert_base] [--rounds 10] [--json out.json]
        [--backend embedl_onnxruntime]
    python bench/bench_precision.py --bf16 --models resnet50,mobilenet_v3_large,bert_base
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import embedl_dynamo  # noqa: E402
from bench.measure import (  # noqa: E402
    calibration_batches,
    compile_ours,
    cosine,
    first_tensor,
    int8_layer_fraction,
    one_line,
    round_robin_medians,
)
from bench.peers import openvino_peer  # noqa: E402
from bench.zoo import ZOO  # noqa: E402
from embedl_dynamo import clear_reports  # noqa: E402
from embedl_dynamo.tuning import half_form  # noqa: E402

VARIANTS = ("fp32", "int8", "mixed")


def bench_model(name: str, rounds: int, backend: str, nncf: bool) -> dict:
    family, build = ZOO[name]
    torch.manual_seed(0)
    model, inputs = build()
    calibration = calibration_batches(inputs)
    with torch.no_grad():
        expected = first_tensor(model(*inputs))
    fns = {"eager": lambda: model(*inputs)}
    row: dict = {"model": name, "family": family}
    cache_dir = tempfile.mkdtemp(prefix=f"embedl_bench_{name}_")
    for precision in VARIANTS:
        torch._dynamo.reset()
        options = {"precision": precision, "cache_dir": cache_dir}
        if precision != "fp32":
            options["calibration_data"] = calibration
        ours = compile_ours(model, inputs, options, backend)
        report = ours.report
        row[f"{precision}_first_s"] = round(ours.first_s, 1)
        row[f"{precision}_cosine"] = round(cosine(ours.output, expected), 5)
        row[f"{precision}_int8"] = int8_layer_fraction(report) if precision != "fp32" else ""
        row[f"{precision}_where"] = ", ".join(sorted({s.runtime for s in report.subgraphs}))
        fns[precision] = ours.call
    if nncf:
        start = time.perf_counter()
        try:
            peer = openvino_peer(model, inputs, calibration, int8=True,
                                 transformer=family == "transformer")  # fmt: skip
            row["nncf_cosine"] = round(cosine(first_tensor(peer()), expected), 5)
        except Exception as exc:  # the peer failing is a cell, not the row
            row["nncf_error"] = one_line(exc, 60)
        else:
            row["nncf_first_s"] = round(time.perf_counter() - start, 1)
            fns["nncf"] = peer
    gc.collect()  # sessions of rejected or measured candidates go before timing starts
    medians = round_robin_medians(fns, rounds)
    row["eager_ms"] = round(medians["eager"] * 1e3, 2)
    for variant in fns:
        row[f"{variant}_x_eager"] = round(medians[variant] / medians["eager"], 3)
    return row


BF16_FORMS = {"typed": half_form.TYPED, "hint": half_form.HINT, "chosen": None}


def _one_form(form: str | None):
    """``half_form_options`` keeping the ``form`` option only (None: both, the real choice)."""
    real = half_form.half_form_options

    def options(*args):
        found = real(*args)
        if form is None or found is None:
            return found
        return [o for o in found if ("typed" in o.label) == (form == half_form.TYPED)]

    return options


def bench_bf16(name: str, rounds: int) -> dict:
    """One model's bf16 row: eager, OpenVINO's default, ours in each form and as chosen."""
    family, build = ZOO[name]
    torch.manual_seed(0)
    model, inputs = build()
    with torch.no_grad():
        expected = first_tensor(model(*inputs))
    peer = openvino_peer(model, inputs, [], int8=False, precision_hint=None)
    fns = {"eager": lambda: model(*inputs), "ov_default": peer}
    row: dict = {"model": name, "family": family}
    row["ov_default_cosine"] = round(cosine(first_tensor(peer()), expected), 5)
    cache_dir = tempfile.mkdtemp(prefix=f"embedl_bench_bf16_{name}_")
    options = {"precision": "bf16", "runtime": "openvino", "cache_dir": cache_dir}
    real = half_form.half_form_options
    for variant, form in BF16_FORMS.items():
        torch._dynamo.reset()
        clear_reports()
        half_form.half_form_options = _one_form(form)
        try:
            compiled = torch.compile(model, backend="embedl_openvino", options=options)
            with torch.no_grad():
                got = first_tensor(compiled(*inputs))
        finally:
            half_form.half_form_options = real
        subgraphs = embedl_dynamo.last_report().subgraphs
        row[f"{variant}_cosine"] = round(cosine(got, expected), 5)
        row[f"{variant}_where"] = "; ".join(s.reason or s.runtime for s in subgraphs)
        fns[variant] = lambda c=compiled: c(*inputs)
    gc.collect()
    medians = round_robin_medians(fns, rounds)
    row["eager_ms"] = round(medians["eager"] * 1e3, 2)
    for variant in fns:
        row[f"{variant}_x_eager"] = round(medians[variant] / medians["eager"], 3)
    row["hint_x_typed"] = round(medians["hint"] / medians["typed"], 3)
    return row


def _bf16_table(rows: list[dict]) -> str:
    head = (
        "| model | eager ms | OpenVINO default | ours bf16 typed | ours bf16 f32 + hint | "
        "hint / typed | ours bf16 chosen | cosine default / typed / hint |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |" + " |" * 6)
            continue
        lines.append(
            f"| {r['model']} | {r['eager_ms']} | {r['ov_default_x_eager']} | "
            f"{r['typed_x_eager']} | {r['hint_x_eager']} | {r['hint_x_typed']} | "
            f"{r['chosen_x_eager']} ({r['chosen_where']}) | {r['ov_default_cosine']} / "
            f"{r['typed_cosine']} / {r['hint_cosine']} |"
        )
    return "\n".join(lines)


def _table(rows: list[dict]) -> str:
    head = (
        "| model | eager ms | fp32 x eager (runtime) | int8 x eager | mixed x eager | "
        "NNCF int8 x eager | int8/fp32 | mixed/fp32 | cosine int8 / mixed / NNCF | "
        "INT8 layers (int8; mixed) | first call s (fp32/int8/mixed) |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |" + " |" * 9)
            continue
        fp32 = r["fp32_x_eager"]
        lines.append(
            f"| {r['model']} | {r['eager_ms']} | {fp32} ({r['fp32_where']}) | "
            f"{r['int8_x_eager']} | {r['mixed_x_eager']} | "
            f"{r.get('nncf_x_eager', 'fails' if 'nncf_error' in r else '')} | "
            f"{r['int8_x_eager'] / fp32:.2f} | {r['mixed_x_eager'] / fp32:.2f} | "
            f"{r['int8_cosine']} / {r['mixed_cosine']} / {r.get('nncf_cosine', '')} | "
            f"{r['int8_int8']}; {r['mixed_int8']} | "
            f"{r['fp32_first_s']}/{r['int8_first_s']}/{r['mixed_first_s']} |"
        )
    done = [r for r in rows if "error" not in r]
    if done:

        def geo(variant: str) -> float:
            ratios = [r[f"{variant}_x_eager"] / r["fp32_x_eager"] for r in done]
            return math.exp(statistics.mean(math.log(v) for v in ratios))

        lines.append(
            f"\ngeometric mean vs our fp32: int8 {geo('int8'):.3f}x, mixed {geo('mixed'):.3f}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="embedl_tensorrt", help="the dynamo backend")
    parser.add_argument("--no-nncf", action="store_true", help="skip the NNCF + OpenVINO peer")
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument("--bf16", action="store_true", help="bf16 forms on OpenVINO instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    nncf = not args.no_nncf and importlib.util.find_spec("nncf") is not None
    rows = []
    for name in args.models.split(","):
        try:
            if args.bf16:
                rows.append(bench_bf16(name, args.rounds))
            else:
                rows.append(bench_model(name, args.rounds, args.backend, nncf))
        except Exception as exc:  # one model's failure is a row, not the end of the run
            rows.append({"model": name, "error": f"{type(exc).__name__}: {str(exc)[:80]}"})
        print(json.dumps(rows[-1]), flush=True)
    print(_bf16_table(rows) if args.bf16 else _table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
