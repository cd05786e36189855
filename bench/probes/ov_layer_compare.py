"""Our ONNX file on OpenVINO against OpenVINO's own conversion of the same model, per layer.

For one registered model (:data:`bench.models.MODELS`, random weights, BatchNorm statistics
settled, batch 1) this compiles, with the same ``INFERENCE_PRECISION_HINT`` (``f32``, or ``--hint bf16``) and
threads:

* **ours**: the fp32 file of ``embedl_dynamo.export(..., backend="openvino", precision="fp32")``
  through :func:`embedl_dynamo.runtimes.openvino.compile.compile_openvino` (so with our
  OpenVINO lowering; ``--no-lowering`` compiles this side's file as OpenVINO reads it);
* **openvino**: ``ov.convert_model(model, example_input=x)``, what an OpenVINO user does.

With ``--precision int8`` the two sides are our INT8 file (``precision="int8"``, OpenVINO's
placement) and NNCF's ``quantize`` of OpenVINO's conversion, both calibrated on the same four
random batches; ``--batch`` sets the batch (the zoo's input repeated).

It then reads what the CPU plugin made of each (``compiled.get_runtime_model()``: per executed
layer its ``layerType``, ``primitiveType`` (the kernel), ``runtimePrecision`` and
``outputLayouts``) and the performance counters (``PERF_COUNT``: real time per node, median
over ``--runs`` calls, the two sides called in turn), and prints (1) the executed layer types
and kernels per side, (2) the layer types only one side runs, (3) the time per layer type on
each side, (4) the largest differences. With
``--rounds`` > 0 it also times both end to end, by the one timer in this process
(:func:`bench.harness.timer.interleaved`), as ratios to openvino: the two infer requests, ours
through ``torch.compile(backend="embedl_openvino")`` (with ``f32``: Dynamo's and our per-call
work on top of the same inference), and with ``--static`` both sides compiled with the input
shape fixed (both files have a dynamic batch; the CPU plugin runs a static graph faster).

The per-layer times come from counters inside each inference, so they move less with the load
of a shared machine than end-to-end medians do; both are printed.

Rows: each layer type's summed PERF_COUNT median per side (``layer_ms``, params: the type)
and the end-to-end latency of each side (``latency``, a ratio to ``openvino``); the printed
report has the rest.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

import embedl_dynamo
from bench import models
from bench.harness.record import Record
from bench.harness.table import by_variant
from bench.harness.timer import interleaved
from embedl_dynamo.runtimes.openvino import compile as ov_compile

__all__ = ["BASELINE", "arguments", "node_times", "run", "runtime_layers", "smoke", "table"]

BASELINE = "openvino"

# runtime-model layers that are not work (graph inputs/outputs, weights)
_NOT_WORK = {"Input", "Output", "Parameter", "Result", "Constant", "Const"}


def export_ours(
    model: torch.nn.Module, x: torch.Tensor, directory: Path, calibration: list | None = None
) -> Path:
    """Our ONNX file for the OpenVINO backend (what ``embedl_openvino`` caches): fp32, or INT8
    calibrated on ``calibration`` (OpenVINO's placement; random weights' INT8 cosines sit below
    the default budget, so the file is written unjudged: this compares speed, per layer)."""
    if calibration is None:
        return embedl_dynamo.export(
            model, (x,), directory / "model.onnx", backend="openvino", precision="fp32"
        )
    return embedl_dynamo.export(
        model,
        (x,),
        directory / "model.onnx",
        backend="openvino",
        precision="int8",
        calibration_data=calibration,
        verify=False,
        options={"accuracy_budget": 0.5},
    )


def _ours(path: Path, hint: str, threads: int, lowering: bool, config: dict) -> Any:
    # f32 is what compile_openvino picks by itself for a float file
    hint = None if hint == "f32" else hint
    if not lowering:
        original = ov_compile.lower_for_openvino
        ov_compile.lower_for_openvino = lambda m: {}
        try:
            return ov_compile.compile_openvino(path, threads, config, hint=hint)
        finally:
            ov_compile.lower_for_openvino = original
    info: dict = {}
    compiled = ov_compile.compile_openvino(path, threads, config, info=info, hint=hint)
    print(f"ours: lowering {info.get('openvino_lowering', {})}")
    return compiled


def _openvino(model, x, hint: str, threads: int, config: dict, calibration=None) -> Any:
    import openvino as ov

    with torch.no_grad():
        ov_model = ov.convert_model(model, example_input=(x,))
    if calibration is not None:  # NNCF's INT8, on the same batches as ours
        import nncf

        data = nncf.Dataset([tuple(t.numpy() for t in batch) for batch in calibration])
        ov_model = nncf.quantize(ov_model, data)
    properties = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads, **config}
    return ov.Core().compile_model(ov_model, "CPU", properties)


def runtime_layers(compiled: Any) -> list[dict[str, str]]:
    """One dict per executed layer of the CPU plugin's runtime model."""
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()

        def get(key: str, info=info) -> str:
            return info[key].astype(str) if key in info else ""

        kind = get("layerType") or op.get_type_name()
        if kind in _NOT_WORK:
            continue
        layers.append(
            {
                "name": op.get_friendly_name(),
                "type": kind,
                "exec": get("primitiveType"),
                "precision": get("runtimePrecision"),
                "layout": get("outputLayouts"),
                "original": get("originalLayersNames"),
            }
        )
    return layers


def node_times(
    compiled: dict[str, Any], feeds: list[np.ndarray], runs: int
) -> dict[str, dict[str, tuple[str, str, float]]]:
    """Per side, node name -> (type, exec type, median ms) from the performance counters over
    ``runs`` calls, the sides called in turn by the one timer (a change in the machine's load
    bills both; the timer's own clock is not used, the counters are)."""
    requests = {side: c.create_infer_request() for side, c in compiled.items()}
    samples: dict[str, dict[str, list[float]]] = {side: defaultdict(list) for side in requests}
    kinds: dict[str, tuple[str, str]] = {}

    def call(side: str):
        def infer() -> None:
            requests[side].infer(feeds)
            for info in requests[side].profiling_info:
                if str(info.status).endswith(".EXECUTED"):
                    ms = info.real_time.total_seconds() * 1000.0
                    samples[side][info.node_name].append(ms)
                    kinds[info.node_name] = (info.node_type, info.exec_type)

        return infer

    plain = {side: (lambda r=r: r.infer(feeds)) for side, r in requests.items()}
    interleaved(plain, 1, warmup=5, repeat=0, pause_s=0.0)  # warm-up, uncounted
    interleaved({side: call(side) for side in requests}, runs, warmup=0, repeat=1, pause_s=0.0)
    return {
        side: {n: (*kinds[n], statistics.median(v)) for n, v in nodes.items()}
        for side, nodes in samples.items()
    }


def _per_type(times: dict[str, tuple[str, str, float]]) -> dict[str, tuple[int, float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for kind, _, ms in times.values():
        out[kind].append(ms)
    return {k: (len(v), sum(v)) for k, v in out.items()}


def _print_report(sides: dict[str, dict]) -> dict:
    names = list(sides)
    print("\n(1) executed layers per side: type, kernel, precision, output layout -> count")
    counts = {
        s: Counter(
            (layer["type"], layer["exec"], layer["precision"], layer["layout"])
            for layer in sides[s]["layers"]
        )
        for s in names
    }
    for key in sorted(set().union(*counts.values())):
        cells = "  ".join(f"{s}={counts[s].get(key, 0):3d}" for s in names)
        print(f"  {key[0]:<16} {key[1]:<26} {key[2]:<5} {key[3]:<6} {cells}")
    fused = {
        s: sum(len(layer["original"].split(",")) for layer in sides[s]["layers"]) for s in names
    }
    print("  source ops behind them: " + "  ".join(f"{s}={n}" for s, n in fused.items()))
    types = {s: {layer["type"] for layer in sides[s]["layers"]} for s in names}
    print("\n(2) layer types on one side only")
    for s in names:
        other = set().union(*(types[o] for o in names if o != s))
        print(f"  only {s}: {sorted(types[s] - other)}")
    per_type = {s: _per_type(sides[s]["times"]) for s in names}
    print("\n(3) time per layer type (PERF_COUNT medians summed, ms): count / ms per side")
    rows = []
    for kind in sorted(set().union(*per_type.values())):
        cells = {s: per_type[s].get(kind, (0, 0.0)) for s in names}
        rows.append((kind, cells))
        text = "  ".join(f"{s}={c[0]:3d}/{c[1]:7.3f}" for s, c in cells.items())
        print(f"  {kind:<22} {text}")
    totals = {s: sum(ms for _, ms in per_type[s].values()) for s in names}
    print("  total                  " + "  ".join(f"{s}={t:7.3f}" for s, t in totals.items()))
    print("\n(4) largest differences per layer type (ours - openvino, ms)")
    diffs = sorted(
        ((c[names[0]][1] - c[names[1]][1], k) for k, c in rows), key=lambda d: -abs(d[0])
    )
    for diff, kind in diffs[:10]:
        print(f"  {kind:<22} {diff:+7.3f}")
    print("\n    largest single nodes per side (ms)")
    for s in names:
        top = sorted(sides[s]["times"].items(), key=lambda kv: -kv[1][2])[:8]
        for node, (kind, exec_type, ms) in top:
            print(f"  {s:<8} {ms:7.3f} {kind:<14} {exec_type:<26} {node[:60]}")
    return {"per_type": {s: per_type[s] for s in names}, "totals": totals}


def _static_requests(model, x, args) -> dict[str, Any]:
    """Both sides with the input shape fixed to ``x``'s (``Model.reshape``) before compiling:
    what the CPU plugin makes of a static graph, against the dynamic batch both export."""
    import openvino as ov

    from embedl_dynamo.runtimes.openvino.lowering import lower_for_openvino

    core = ov.Core()
    ours = core.read_model(str(args.path))
    lower_for_openvino(ours)
    with torch.no_grad():
        theirs = ov.convert_model(model, example_input=(x,))
    properties = {"INFERENCE_PRECISION_HINT": args.hint, "INFERENCE_NUM_THREADS": args.threads}
    requests = {}
    for side, ov_model in (("ours static", ours), ("openvino static", theirs)):
        ov_model.reshape({ov_model.inputs[0]: list(x.shape)})
        requests[side] = core.compile_model(ov_model, "CPU", properties).create_infer_request()
    return requests


def _end_to_end(model, x, compiled: dict, args) -> dict:
    """Both sides timed round-robin (as raw infer requests; and ours as the user runs it,
    ``torch.compile(backend="embedl_openvino")``, with its per-call work); ratios to openvino."""
    feeds = [x.numpy()]
    requests = {s: c.create_infer_request() for s, c in compiled.items()}
    with torch.no_grad():
        ref = model(x).numpy()
    for side, request in requests.items():
        out = request.infer(feeds)[0]
        print(f"{side}: max abs diff to eager {float(np.abs(out - ref).max()):.2e}")
    fns = {s: (lambda r=r: r.infer(feeds)) for s, r in requests.items()}
    if args.static:
        for side, request in _static_requests(model, x, args).items():
            fns[side] = lambda r=request: r.infer(feeds)
    # ours as the user runs it, where its hint is the one the raw requests use: fp32 with f32;
    # INT8 with bf16 (its float rest in bf16 on a CPU with AVX512_BF16, as OpenVINO's default)
    if (args.precision, args.hint) in (("fp32", "f32"), ("int8", "bf16")):
        options = {
            "precision": args.precision,
            "num_threads": args.threads,
            "cache_dir": str(args.path.parent / "cache"),
        }
        if args.precision == "int8":
            options.update(calibration_data=args.calibration, accuracy_budget=0.5)
        ours_compiled = torch.compile(model, backend="embedl_openvino", options=options)
        with torch.no_grad():
            ours_compiled(x)
        fns["ours (torch.compile)"] = lambda: ours_compiled(x)
    medians = interleaved(fns, args.rounds, mode=torch.no_grad).medians()
    print(f"\nend to end ({args.rounds} rounds, medians)")
    for side, seconds in medians.items():
        ratio = seconds / medians["openvino"]
        print(f"  {side:<22} {seconds * 1e3:8.3f} ms  {ratio:.3f}x openvino")
    return medians


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--model", default="mobilenet_v3_large", help="a registered model")
    parser.add_argument("--hint", default="f32", choices=("f32", "bf16"))
    parser.add_argument("--runs", type=int, default=50, help="profiled runs per side")
    parser.add_argument("--rounds", type=int, default=0, help="end-to-end rounds (0: none)")
    parser.add_argument("--no-lowering", action="store_true", help="ours without our lowering")
    parser.add_argument(
        "--static", action="store_true", help="end to end also with the input shape fixed"
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "int8"),
        help="int8: ours against NNCF's INT8 of OpenVINO's conversion",
    )
    parser.add_argument("--batch", type=int, default=1)


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN, 3 profiled runs, 2 end-to-end rounds."""
    args.model, args.runs, args.rounds = "tiny_cnn", 3, 2


def _setup(args: argparse.Namespace, scratch: str):
    """The model, its input at ``--batch``, calibration (INT8) and the two sides' builders."""
    model, (x,) = models.build(args.model)
    x = x.expand(args.batch, *x.shape[1:]).contiguous()
    generator = torch.Generator().manual_seed(1)
    calibration = None
    if args.precision == "int8":
        calibration = [(torch.randn(x.shape, generator=generator),) for _ in range(4)]
    path = args.path = export_ours(model, x, Path(scratch), calibration)
    args.calibration = calibration
    builders = {
        "ours": lambda cfg: _ours(path, args.hint, args.threads, not args.no_lowering, cfg),
        "openvino": lambda cfg: _openvino(model, x, args.hint, args.threads, cfg, calibration),
    }
    return model, x, builders


def run(args: argparse.Namespace, record: Record) -> None:
    """Profile both sides, print the report, add the per-type and end-to-end rows."""
    with tempfile.TemporaryDirectory(prefix="ov_layer_compare_") as scratch:
        model, x, builders = _setup(args, scratch)
        profiled = {side: build({"PERF_COUNT": True}) for side, build in builders.items()}
        times = node_times(profiled, [x.numpy()], args.runs)
        sides = {s: {"layers": runtime_layers(c), "times": times[s]} for s, c in profiled.items()}
        del profiled
        print(
            f"{args.model}, {args.precision}, batch {args.batch}, hint {args.hint}, "
            f"{args.threads} threads, {args.runs} profiled runs"
        )
        result = _print_report(sides)
        params = {"precision": args.precision, "batch": args.batch, "hint": args.hint}
        for side, per_type in result["per_type"].items():
            for kind, (count, ms) in per_type.items():
                record.add(
                    args.model,
                    side,
                    "layer_ms",
                    ms,
                    "ms (counters)",
                    params={**params, "layer_type": kind},
                    info={"count": count},
                )
        if args.rounds:
            compiled = {side: build({}) for side, build in builders.items()}
            for side, seconds in _end_to_end(model, x, compiled, args).items():
                record.add(args.model, side, "latency", seconds * 1e3, "ms", params=params)


def table(record: Record, view: str = "main") -> str:
    """``main``: end to end, each side over OpenVINO's; ``layers``: ms per layer type."""
    if view == "layers":
        return by_variant(record, "layer_ms", show="value")
    return by_variant(record, "latency")
