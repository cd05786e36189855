"""First output of a fresh process: cold (empty cache), warm (the cache the cold one wrote) and
from a read-only copy of that cache moved elsewhere, beside the same model's construction, its
eager first call and Dynamo's trace; and ``load()`` of the exported file.

Each phase runs in a process of its own (``python -m bench.bench_cold_start --child ...``), one
after the other, so every number is a process's first. Cases:

* ``resnet50-fp32``, ``resnet50-int8``, ``resnet50-mixed``: torchvision's ResNet-50 (random
  weights, BatchNorm statistics settled), batch 1, ``embedl_openvino``; INT8 and mixed calibrate
  on 4 random batches given as ``calibration_data``;
* ``bert-fp32``: BERT-base, sequence 128, ``embedl_openvino``;
* ``qwen-int4``, ``qwen-int8``: the Qwen2.5-0.5B shape (``--layers``, default 24),
  ``model.forward = torch.compile(...)`` at int4/int8 weight-only (``accuracy_budget=0.5``:
  random weights), first output = the first ``generate()`` of ``--new-tokens`` tokens;
  ``qwen-int4-dynamic`` passes ``dynamic=True`` (two graphs instead of three).

Columns (seconds): ``construct`` (building the model), ``eager`` (its first eager call),
``trace`` (Dynamo's trace alone: the first call through ``backend="eager"`` less an eager
call), ``cold``/``warm``/``read-only`` (the first compiled output, construction excluded),
``load`` (``load()`` of the exported file plus its first call; CNN and BERT cases).

Usage: ``python -m bench.bench_cold_start [--cases resnet50-int8 qwen-int4 ...] [--layers 24]
[--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

CASES = ("resnet50-fp32", "resnet50-int8", "resnet50-mixed", "bert-fp32", "qwen-int4",
         "qwen-int8", "qwen-int4-dynamic")  # fmt: skip
PHASES = ("eager", "cold", "warm", "read-only", "load")


def _model(case: str, layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    if case.startswith("qwen"):
        from bench.bench_llm import qwen2_0_5b

        model = qwen2_0_5b(layers)
        ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(0))
        return model, (ids,)
    from bench.zoo import ZOO

    torch.manual_seed(0)
    return ZOO["resnet50" if case.startswith("resnet50") else "bert_base"][1]()


def _options(case: str, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    precision = case.split("-")[1]
    if case.startswith("qwen"):
        return {"precision": f"{precision}_weight_only", "accuracy_budget": 0.5}
    options: dict[str, Any] = {"precision": precision}
    if precision == "int8":  # random weights and data miss the default budget (cosine about
        options["accuracy_budget"] = 0.95  # 0.98), and the float file would run instead
    if precision in ("int8", "mixed"):
        generator = torch.Generator().manual_seed(1)
        options["calibration_data"] = [
            tuple(torch.randn(t.shape, generator=generator) for t in inputs) for _ in range(4)
        ]
    return options


def _first_output(case: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                  backend: str, options: dict[str, Any] | None, new_tokens: int) -> float:  # fmt: skip
    """Seconds to the first output through ``backend`` (None options: eager)."""
    start = time.perf_counter()
    if case.startswith("qwen"):
        if options is not None or backend == "eager":
            compile_options = {"options": options} if options is not None else {}
            if case.endswith("-dynamic"):  # sizes symbolic from the first trace: two graphs
                compile_options["dynamic"] = True
            model.forward = torch.compile(model.forward, backend=backend, **compile_options)
        with torch.no_grad():
            model.generate(*inputs, max_new_tokens=new_tokens, do_sample=False)
    else:
        run = model
        if options is not None or backend == "eager":
            compile_options = {"options": options} if options is not None else {}
            run = torch.compile(model, backend=backend, **compile_options)
        with torch.inference_mode():
            run(*inputs)
    return time.perf_counter() - start


def child(case: str, phase: str, layers: int, new_tokens: int, export_path: str) -> dict:
    """One phase in this (fresh) process."""
    import warnings

    warnings.simplefilter("ignore")
    import embedl_dynamo

    start = time.perf_counter()
    model, inputs = _model(case, layers)
    result: dict[str, Any] = {"construct": time.perf_counter() - start}
    if phase == "eager":
        result["eager"] = _first_output(case, model, inputs, "", None, new_tokens)
        again = _first_output(case, model, inputs, "", None, new_tokens)
        result["trace"] = _first_output(case, model, inputs, "eager", None, new_tokens) - again
    elif phase == "load":
        start = time.perf_counter()
        loaded = embedl_dynamo.load(export_path)
        with torch.inference_mode():
            loaded(*inputs)
        result["load"] = time.perf_counter() - start
        result["runtime"] = loaded.runtime
    else:
        options = _options(case, inputs)
        backend = "embedl_onnxruntime" if case.startswith("qwen") else "embedl_openvino"
        result[phase] = _first_output(case, model, inputs, backend, options, new_tokens)
        reports = embedl_dynamo.last_report()
        result["loaded"] = [r.loaded or "built" for r in reports]
        result["runtime"] = sorted({r.runtime for r in reports})
        embedl_dynamo.wait_for_cache_writes()
        if phase == "cold" and not case.startswith("qwen"):
            # random weights and data: an INT8 file may miss the budget, timed all the same
            embedl_dynamo.export(model, inputs, export_path, backend="openvino",
                                 precision=options["precision"], verify=False,
                                 calibration_data=options.get("calibration_data"))  # fmt: skip
    return result


def _run_phase(case: str, phase: str, cache: Path, args: argparse.Namespace, path: str) -> dict:
    env = {**os.environ, "EMBEDL_DYNAMO_CACHE_DIR": str(cache)}
    env.pop("EMBEDL_DYNAMO_CACHE_READ_ONLY", None)
    if phase == "read-only":
        env["EMBEDL_DYNAMO_CACHE_READ_ONLY"] = "1"
    command = [sys.executable, "-m", "bench.bench_cold_start", "--child", case, phase,
               "--layers", str(args.layers), "--new-tokens", str(args.new_tokens),
               "--export-path", path]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_case(case: str, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="embedl_cold_start_"))
    try:
        cache, row = work / "cache", {"case": case}
        path = str(work / "model.onnx")
        for phase in PHASES:
            if phase == "load" and case.startswith("qwen"):
                continue
            where = cache
            if phase == "read-only":
                where = work / "elsewhere" / "cache"
                shutil.copytree(cache, where)
            result = _run_phase(case, phase, where, args, path)
            for key, value in result.items():
                if key in ("loaded", "runtime", "error"):
                    row[f"{phase}:{key}"] = value
                else:  # construct: the first phase's
                    row.setdefault(key, value)
            print(f"  {case} {phase}: {json.dumps(result)}", flush=True)
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PHASE"), help=argparse.SUPPRESS)
    parser.add_argument("--export-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.layers, args.new_tokens, args.export_path)))
        return
    rows = [run_case(case, args) for case in args.cases]
    columns = ("construct", "eager", "trace", "cold", "warm", "read-only", "load")
    print("case".ljust(16) + "".join(c.rjust(11) for c in columns) + "  (seconds)")
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row.get(c), float) else "-" for c in columns]
        print(row["case"].ljust(16) + "".join(c.rjust(11) for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
