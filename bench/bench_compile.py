"""ResNet-50 through ``torch.compile`` on this CPU: eager vs inductor vs ``embedl_tensorrt``.

Measures, in one run (random weights, 224x224, batch 1 and 8, 2 threads):

* median latency of eager PyTorch, ``torch.compile(backend="inductor")`` and
  ``torch.compile(backend="embedl_tensorrt")`` (ONNX Runtime here);
* cold compile time (first call in a fresh process with an empty cache directory);
* warm compile time (first call in a *new* process with the cache left by the cold run).

Every measurement runs in its own subprocess, so compile caches and thread pools do not leak
between them. Targets: embedl latency <= 0.55x eager at batch 1, cold compile <= 15 s, warm
compile <= 3 s. The machine may be shared: read ratios from the same run, not absolute times.

Usage::

    python bench/bench_compile.py [--iters 20] [--skip-inductor] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_LATENCY_RATIO = 0.55
TARGET_COLD_S = 15.0
TARGET_WARM_S = 3.0
THREADS = 2


def _worker(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.models import resnet50

    torch.set_num_threads(THREADS)
    model = resnet50().eval()
    if args.mode == "eager":
        run = model
    elif args.mode == "inductor":
        run = torch.compile(model, backend="inductor")
    else:
        options = {"num_threads": THREADS, "cache_dir": args.cache}
        run = torch.compile(model, backend="embedl_tensorrt", options=options)
    result: dict[str, object] = {"mode": args.mode}
    with torch.no_grad():
        for batch in args.batches:
            x = torch.randn(batch, 3, 224, 224)
            start = time.perf_counter()
            y = run(x)
            result[f"first_call_s_bs{batch}"] = time.perf_counter() - start
            if args.check:
                ref = model(x)
                result[f"max_rel_err_bs{batch}"] = float((y - ref).abs().max() / ref.abs().max())
            for _ in range(3):
                run(x)
            times = []
            for _ in range(args.iters if batch == 1 else max(3, args.iters // 3)):
                start = time.perf_counter()
                run(x)
                times.append(time.perf_counter() - start)
            result[f"median_ms_bs{batch}"] = 1000 * statistics.median(times)
    print(json.dumps(result))


def _spawn(mode: str, batches: list[int], iters: int, cache: str, check: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--iters", str(iters), "--cache", cache]
    cmd += ["--batches", *map(str, batches)] + (["--check"] if check else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["eager", "inductor", "embedl"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cache", default="")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--skip-inductor", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.worker:
        _worker(args.__class__(**{**vars(args), "mode": args.worker}))
        return

    with tempfile.TemporaryDirectory(prefix="embedl_bench_cache_") as cache:
        eager = _spawn("eager", args.batches, args.iters, cache)
        cold = _spawn("embedl", args.batches, args.iters, cache, check=True)
        warm = _spawn("embedl", [1], 3, cache)
        inductor = (
            None if args.skip_inductor else _spawn("inductor", args.batches, args.iters, cache)
        )

    print(f"ResNet-50, 224x224, {THREADS} threads (medians; shared machine, compare ratios)")
    print(f"{'':<24}" + "".join(f"{'bs' + str(b) + ' ms':>12}" for b in args.batches))
    rows = [("eager", eager), ("inductor", inductor), ("embedl_tensorrt (ORT)", cold)]
    for name, r in rows:
        if r is not None:
            cells = "".join(f"{r[f'median_ms_bs{b}']:>12.1f}" for b in args.batches)
            print(f"{name:<24}{cells}")
    summary = {
        "eager": eager,
        "inductor": inductor,
        "embedl_cold": cold,
        "embedl_warm": warm,
        "ratios": {
            f"embedl_vs_eager_bs{b}": cold[f"median_ms_bs{b}"] / eager[f"median_ms_bs{b}"]
            for b in args.batches
        },
        "cold_compile_s": cold[f"first_call_s_bs{args.batches[0]}"],
        "warm_compile_s": warm["first_call_s_bs1"],
    }
    if inductor is not None:
        summary["ratios"].update(
            {
                f"inductor_vs_eager_bs{b}": inductor[f"median_ms_bs{b}"] / eager[f"median_ms_bs{b}"]
                for b in args.batches
            }
        )
        summary["inductor_compile_s"] = inductor[f"first_call_s_bs{args.batches[0]}"]
    for key, value in summary["ratios"].items():
        print(f"{key:<28}{value:>8.2f}x")
    ratio1 = summary["ratios"].get("embedl_vs_eager_bs1")
    print(
        f"cold compile {summary['cold_compile_s']:.1f} s (target <= {TARGET_COLD_S:.0f}), "
        f"warm compile {summary['warm_compile_s']:.2f} s (target <= {TARGET_WARM_S:.0f}), "
        f"bs1 ratio {ratio1:.2f}x (target <= {TARGET_LATENCY_RATIO})"
        if ratio1 is not None
        else ""
    )
    if inductor is not None:
        print(f"inductor first call {summary['inductor_compile_s']:.1f} s")
    errs = {k: v for k, v in cold.items() if k.startswith("max_rel_err")}
    print("embedl max error relative to output scale:", errs)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
