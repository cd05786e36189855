"""Per kernel, where a weight-only decode step's time goes on ONNX Runtime, and how fast each
kind of kernel streams its weights.

The Qwen2.5-0.5B shape (:func:`bench.models.decoder.qwen2_0_5b`, ``--layers``) is compiled with
``model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")`` at
``--precision`` (``accuracy_budget=0.5``: random weights), every ONNX Runtime session made with
its profiler on (``SessionOptions.enable_profiling``). After a warm-up ``generate()``, one
``generate()`` of ``--new-tokens`` runs; the session that ran most often is the decode graph.
Over its last ``--steps`` runs, ONNX Runtime's own per-node events are summed by op type: time
per step, share of the step, the weight bytes the nodes read (the profiler's
``parameter_size``, and ``MatMulNBits``' prepacked codes, see :func:`_weight_bytes`) and
those bytes over the time, against the read bandwidth a
large ``sum`` reaches here (:func:`bench.harness.bandwidth.read_bandwidth_gbs`). The times
are ONNX Runtime's own, not the harness timer's: this probe reads a profiler.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.harness.bandwidth import read_bandwidth_gbs
from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.models.decoder import generate, prompt, qwen2_0_5b

__all__ = ["BASELINE", "arguments", "run", "smoke", "summarize", "table"]

BASELINE = None


def _profiled_sessions(folder: str) -> list[Any]:
    """Make every session this package creates profile into ``folder``; returns them."""
    import onnxruntime

    from embedl_dynamo.runtimes.onnxruntime import runtime, session

    sessions: list[Any] = []
    create = session.create_session

    def profiling(model, providers=None, *, options=None, **kwargs):
        options = options or onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "ort")
        made = create(model, providers, options=options, **kwargs)
        sessions.append(made)
        return made

    session.create_session = profiling
    runtime.create_session = profiling
    return sessions


def _decode_events(path: str, steps: int) -> list[dict[str, Any]]:
    """The node events inside the last ``steps`` runs of a profile."""
    events = json.loads(Path(path).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][-steps:]
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    nodes = [
        e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
    ]
    return [e for e in nodes if any(a <= e["ts"] <= b for a, b in spans)]


def _weight_bytes(args: dict[str, Any], bits: int) -> float:
    """The weight bytes a node reads. ``MatMulNBits``' packed codes are prepacked out of the
    profiler's ``parameter_size`` (only scales and zero points remain in it): its codes are
    ``K * N * bits / 8`` from the activation's last size K, the output's N, and ``bits`` from
    the zero points (a byte per block at 8 bits, rounded-up half bytes at 4) where there are
    any. ``Gather`` reads one row of its table, not the table: 0."""
    op, parameters = args.get("op_name"), float(args.get("parameter_size", 0))
    if op == "Gather":
        return 0.0
    if op != "MatMulNBits":
        return parameters
    shapes = [next(iter(s.values())) for s in args["input_type_shape"]]
    k, n = shapes[0][-1], next(iter(args["output_type_shape"][0].values()))[-1]
    blocks = shapes[1][0] // n if len(shapes) > 1 else 1
    if len(shapes) > 2 and shapes[2][0] == n * blocks:
        bits = 8
    elif len(shapes) > 2:
        bits = 4
    return k * n * bits / 8 + parameters


def _label(args: dict[str, Any]) -> str:
    """The op type; a ``MatMulNBits`` with its K x N (a layer's projections, the head)."""
    op = args.get("op_name", "?")
    if op != "MatMulNBits":
        return op
    k = next(iter(args["input_type_shape"][0].values()))[-1]
    n = next(iter(args["output_type_shape"][0].values()))[-1]
    return f"MatMulNBits {k}x{n}"


def summarize(events: list[dict[str, Any]], steps: int, bandwidth: float, bits: int) -> list[dict]:
    """Rows by op type: ms per step, share, weight MB per step, GB/s and that over bandwidth."""
    time_us, weight_bytes, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for event in events:
        op = _label(event["args"])
        time_us[op] += event["dur"]
        weight_bytes[op] += _weight_bytes(event["args"], bits)
        count[op] += 1
    total = sum(time_us.values())
    rows = []
    for op in sorted(time_us, key=time_us.get, reverse=True):
        seconds = time_us[op] / 1e6
        gbs = weight_bytes[op] / seconds / 1e9 if seconds else 0.0
        rows.append(
            {
                "op": op,
                "nodes": count[op] // steps,
                "ms": time_us[op] / 1e3 / steps,
                "share": time_us[op] / total,
                "weight_mb": weight_bytes[op] / 1e6 / steps,
                "gbs": gbs,
                "of_bandwidth": gbs / bandwidth,
            }
        )
    return rows


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--precision", default="int4_weight_only")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=16)


def smoke(args: argparse.Namespace) -> None:
    """Two layers, 6 new tokens, the last 4 steps."""
    args.layers, args.new_tokens, args.steps = 2, 6, 4


def run(args: argparse.Namespace, record: Record) -> None:
    """Profile the decode steps and add a row set per op type."""
    bandwidth = read_bandwidth_gbs()
    record.extra["bandwidth_gbs"] = bandwidth
    with tempfile.TemporaryDirectory(prefix="embedl-decode-kernels-") as folder:
        sessions = _profiled_sessions(folder)
        model = qwen2_0_5b(args.layers)
        options = {"precision": args.precision, "accuracy_budget": 0.5}
        model.forward = torch.compile(model.forward, backend="embedl_onnxruntime", options=options)
        ids = prompt(64)
        generate(model, ids, 4)
        generate(model, ids, args.new_tokens)
        profiles = [s.end_profiling() for s in sessions]
        runs = [
            sum(e.get("name") == "model_run" for e in json.loads(Path(p).read_text()))
            for p in profiles
        ]
        decode = profiles[max(range(len(runs)), key=runs.__getitem__)]
        bits = 4 if args.precision.startswith("int4") else 8
        rows = summarize(_decode_events(decode, args.steps), args.steps, bandwidth, bits)
    params = {"layers": args.layers, "precision": args.precision}
    units = {
        "nodes": "nodes",
        "ms": "ms",
        "share": "fraction",
        "weight_mb": "MB",
        "gbs": "GB/s",
        "of_bandwidth": "fraction",
    }
    for row in rows:
        for metric, unit in units.items():
            record.add("qwen2_0_5b", row["op"], metric, row[metric], unit, params=params)
    print(
        f"decode step {sum(r['ms'] for r in rows):.2f} ms in nodes; bandwidth {bandwidth:.1f} GB/s"
    )


def table(record: Record, view: str = "main") -> str:
    """A line per op type: nodes, ms a step, share, weight MB, GB/s, of the bandwidth."""
    return by_metric(record, ("nodes", "ms", "share", "weight_mb", "gbs", "of_bandwidth"))
