"""Per kernel, where a weight-only decode step's time goes on ONNX Runtime, and how fast each
kind of kernel streams its weights.

The Qwen2.5-0.5B shape (:func:`bench.bench_llm.qwen2_0_5b`, ``--layers``) is compiled with
``model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")`` at
``--precision`` (``accuracy_budget=0.5``: random weights), every ONNX Runtime session made with
its profiler on (``SessionOptions.enable_profiling``). After a warm-up ``generate()``, one
``generate()`` of ``--new-tokens`` runs; the session that ran most often is the decode graph.
Over its last ``--steps`` runs, ONNX Runtime's own per-node events are summed by op type: time
per step, share of the step, the weight bytes the nodes read (the profiler's
``parameter_size``, and ``MatMulNBits``' prepacked codes, see :func:`_weight_bytes`) and
those bytes over the time, against the read bandwidth a
large ``sum`` reaches here (:func:`bench.bench_llm.read_bandwidth_gbs`).

Usage: ``python -m bench.decode_kernels [--layers 24] [--precision int4_weight_only]
[--new-tokens 24] [--steps 16]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.bench_llm import generate, qwen2_0_5b, read_bandwidth_gbs


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
        rows.append({"op": op, "nodes": count[op] // steps, "ms": time_us[op] / 1e3 / steps,
                     "share": time_us[op] / total, "weight_mb": weight_bytes[op] / 1e6 / steps,
                     "gbs": gbs, "of_bandwidth": gbs / bandwidth})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--precision", default="int4_weight_only")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    bandwidth = read_bandwidth_gbs()
    with tempfile.TemporaryDirectory(prefix="embedl-decode-kernels-") as folder:
        sessions = _profiled_sessions(folder)
        model = qwen2_0_5b(args.layers)
        options = {"precision": args.precision, "accuracy_budget": 0.5}
        model.forward = torch.compile(model.forward, backend="embedl_onnxruntime", options=options)
        ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(0))
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
    step = sum(r["ms"] for r in rows)
    print(f"read bandwidth {bandwidth:.1f} GB/s; decode step {step:.2f} ms in nodes "
          f"({args.precision}, {args.layers} layers, last {args.steps} steps)")  # fmt: skip
    print("| op | nodes | ms/step | share | weights MB/step | GB/s | of bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['nodes']} | {r['ms']:.3f} | {r['share']:.1%} | "
              f"{r['weight_mb']:.1f} | {r['gbs']:.1f} | {r['of_bandwidth']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
