"""First output of a fresh process: cold, warm, from a read-only copy of the cache, and load().

Each phase runs in a process of its own (``python -m bench.suites.cold_start --child ...``),
one after the other, so every number is a process's first. Cases (``--cases``):

* ``resnet50-fp32``, ``resnet50-int8``, ``resnet50-mixed``: torchvision's ResNet-50 (random
  weights, BatchNorm statistics settled), batch 1, ``embedl_openvino``; INT8 and mixed
  calibrate on 4 random batches (INT8 at ``accuracy_budget=0.95``: on random weights and data
  its cosine is about 0.98, and below the default budget the float file would run instead);
* ``bert-fp32``: BERT-base, sequence 128, ``embedl_openvino``;
* ``qwen-int4``, ``qwen-int8``: the Qwen2.5-0.5B shape (``--layers``), ``model.forward =
  torch.compile(...)`` at int4/int8 weight-only on ONNX Runtime (``accuracy_budget=0.5``:
  random weights); first output = the first ``generate()`` of ``--new-tokens`` tokens;
  ``qwen-int4-dynamic`` passes ``dynamic=True``;
* ``tiny-fp32``: the tiny CNN (``--smoke``).

Metrics, seconds: ``construct`` (building the model), ``eager`` (its first eager call),
``trace`` (Dynamo's trace alone: the first call through ``backend="eager"`` less an eager
call), ``cold``/``warm``/``read_only`` (the first compiled output, construction excluded:
an empty cache, the cache the cold process wrote, that cache copied elsewhere and read with
``EMBEDL_DYNAMO_CACHE_READ_ONLY=1``), ``load`` (``load()`` of the exported file plus its first
call; not for the decoder), ``saved`` (``load_compiled`` of the function the cold process saved
with ``save_compiled(..., bundle=True)`` plus its first call: no Dynamo trace; not for the
decoder, whose ``generate()`` loop cannot be saved). Each compiled phase's row says whether
every subgraph was ``loaded`` and where it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import timed_call

__all__ = ["BASELINE", "CASES", "arguments", "child", "run", "smoke", "table"]

BASELINE = None
# case -> (model, our variant)
CASES = {
    "resnet50-fp32": ("resnet50", "ours-fp32@openvino"),
    "resnet50-int8": ("resnet50", "ours-int8@openvino"),
    "resnet50-mixed": ("resnet50", "ours-mixed@openvino"),
    "bert-fp32": ("bert_base", "ours-fp32@openvino"),
    "qwen-int4": ("qwen2_0_5b", "ours-int4_weight_only@onnxruntime"),
    "qwen-int8": ("qwen2_0_5b", "ours-int8_weight_only@onnxruntime"),
    "qwen-int4-dynamic": ("qwen2_0_5b", "ours-int4_weight_only@onnxruntime+dynamic"),
    "tiny-fp32": ("tiny_cnn", "ours-fp32@openvino"),
}
PHASES = ("eager", "cold", "warm", "read_only", "load", "saved")
METRICS = ("construct", "eager", "trace", "cold", "warm", "read_only", "load", "saved")
#: the phases a file or a saved function serves, which the decoder's generate() loop has not
_FILE_PHASES = ("load", "saved")


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    default = [c for c in CASES if c != "tiny-fp32"]
    parser.add_argument("--cases", nargs="+", default=default, choices=list(CASES))
    parser.add_argument("--layers", type=int, default=24, help="the decoder's layers")
    parser.add_argument("--new-tokens", type=int, default=16)


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN in float on OpenVINO."""
    args.cases = ["tiny-fp32"]


def _model(case: str, layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from bench import models

    if case.startswith("qwen"):
        from bench.models.decoder import prompt, qwen2_0_5b

        return qwen2_0_5b(layers), (prompt(64),)
    return models.build(CASES[case][0])


def _options(case: str, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    from bench.variants.ours import parse

    precision = parse(CASES[case][1])[0]
    options: dict[str, Any] = {"precision": precision}
    if case.startswith("qwen"):
        options["accuracy_budget"] = 0.5
    elif precision == "int8":
        options["accuracy_budget"] = 0.95
    if precision in ("int8", "mixed"):
        generator = torch.Generator().manual_seed(1)
        options["calibration_data"] = [
            tuple(torch.randn(t.shape, generator=generator) for t in inputs) for _ in range(4)
        ]
    return options


def _first_output(case, model, inputs, backend: str, options, new_tokens: int) -> float:
    """Seconds to the first output through ``backend`` ("": eager; None options: no ours)."""
    from bench.variants.ours import parse

    def first() -> None:
        compile_options: dict[str, Any] = {"options": options} if options is not None else {}
        if case.startswith("qwen"):
            if backend:
                if parse(CASES[case][1])[2]:  # sizes symbolic from the first trace
                    compile_options["dynamic"] = True
                model.forward = torch.compile(model.forward, backend=backend, **compile_options)
            with torch.no_grad():
                model.generate(*inputs, max_new_tokens=new_tokens, do_sample=False)
            return
        run = torch.compile(model, backend=backend, **compile_options) if backend else model
        with torch.inference_mode():
            run(*inputs)

    return timed_call(first)[1]


def child(case: str, phase: str, layers: int, new_tokens: int, export_path: str) -> dict:
    """One phase in this (fresh) process."""
    import warnings

    warnings.simplefilter("ignore")
    import embedl_dynamo
    from bench.variants.ours import parse

    (model, inputs), construct = timed_call(_model, case, layers)
    result: dict[str, Any] = {"construct": construct}
    if phase == "eager":
        result["eager"] = _first_output(case, model, inputs, "", None, new_tokens)
        again = _first_output(case, model, inputs, "", None, new_tokens)
        result["trace"] = _first_output(case, model, inputs, "eager", None, new_tokens) - again
    elif phase == "load":

        def load_and_call():
            loaded = embedl_dynamo.load(export_path)
            with torch.inference_mode():
                loaded(*inputs)
            return loaded

        loaded, result["load"] = timed_call(load_and_call)
        result["runtime"] = loaded.runtime
    elif phase == "saved":
        result.update(_saved_first_output(_saved_path(export_path), model, inputs))
    else:
        options = _options(case, inputs)
        backend = parse(CASES[case][1])[1]
        result[phase] = _first_output(case, model, inputs, backend, options, new_tokens)
        reports = embedl_dynamo.last_report()
        result["loaded"] = [r.loaded or "built" for r in reports]
        result["runtime"] = sorted({r.runtime for r in reports})
        embedl_dynamo.wait_for_cache_writes()
        if phase == "cold" and not case.startswith("qwen"):
            embedl_dynamo.save_compiled(
                model, inputs, _saved_path(export_path), backend=backend, bundle=True, **options
            )
            embedl_dynamo.export(
                model,
                inputs,
                export_path,
                backend=backend.removeprefix("embedl_"),
                precision=options["precision"],
                verify=False,
                calibration_data=options.get("calibration_data"),
            )
    return result


def _saved_path(export_path: str) -> str:
    return str(Path(export_path).with_suffix(".compiled"))


def _saved_first_output(path: str, model: torch.nn.Module, inputs: tuple) -> dict[str, Any]:
    """``load_compiled`` of ``path`` and its first call (under ``no_grad``, as it asks)."""
    import embedl_dynamo

    def load_and_call():
        loaded = embedl_dynamo.load_compiled(path, model)
        with torch.no_grad():
            loaded(*inputs)
        return loaded

    loaded, seconds = timed_call(load_and_call)
    report = loaded.report
    return {"saved": seconds, "loaded": [report.loaded or "built"], "runtime": [report.runtime]}


def _run_phase(case: str, phase: str, cache: Path, args: argparse.Namespace, path: str) -> dict:
    env = {**os.environ, "EMBEDL_DYNAMO_CACHE_DIR": str(cache)}
    env.pop("EMBEDL_DYNAMO_CACHE_READ_ONLY", None)
    if phase == "read_only":
        env["EMBEDL_DYNAMO_CACHE_READ_ONLY"] = "1"
    command = [
        sys.executable,
        "-m",
        "bench.suites.cold_start",
        "--child",
        case,
        phase,
        "--layers",
        str(args.layers),
        "--new-tokens",
        str(args.new_tokens),
        "--export-path",
        path,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _case(record: Record, case: str, args: argparse.Namespace) -> None:
    model, variant = CASES[case]
    work = Path(tempfile.mkdtemp(prefix="embedl_cold_start_"))
    try:
        cache, path, seen = work / "cache", str(work / "model.onnx"), set()
        for phase in PHASES:
            if phase in _FILE_PHASES and case.startswith("qwen"):
                continue
            where = cache
            if phase == "read_only":
                where = work / "elsewhere" / "cache"
                shutil.copytree(cache, where)
            result = _run_phase(case, phase, where, args, path)
            print(f"  {case} {phase}: {json.dumps(result)}", flush=True)
            if "error" in result:
                record.fail(model, variant, f"{phase}: {result['error']}"[:200])
                continue
            info = {k: result[k] for k in ("loaded", "runtime") if k in result}
            for metric in METRICS:
                if metric in result and metric not in seen:  # construct: the first phase's
                    seen.add(metric)
                    record.add(
                        model,
                        variant,
                        metric,
                        round(result[metric], 3),
                        "s",
                        info=info if metric == phase else None,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, record: Record) -> None:
    """Every case, phase after phase, each in a fresh process."""
    for case in args.cases:
        _case(record, case, args)


def table(record: Record, view: str = "main") -> str:
    """A line per case: each phase's seconds."""
    return by_metric(record, METRICS, labels={m: f"{m} s" for m in METRICS})


def _main() -> None:
    parser = argparse.ArgumentParser(description="one phase of a cold-start case (internal)")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PHASE"), required=True)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--export-path", required=True)
    args = parser.parse_args()
    print(json.dumps(child(*args.child, args.layers, args.new_tokens, args.export_path)))


if __name__ == "__main__":
    _main()
