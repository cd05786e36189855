"""Where a decode step's time goes, per token, beside eager and inductor in the same process.

A decoder's ``generate()`` through ``model.forward = torch.compile(model.forward,
backend=...)`` is timed in nested layers, each by a timer wrapped around one callable:

* ``runtime``: the runtime's own inference (ONNX Runtime's ``InferenceSession.run`` /
  ``run_with_iobinding``, OpenVINO's ``InferRequest.infer``);
* ``tensors``: our runtime wrapper around it (torch <-> numpy, I/O binding);
* ``our call``: the callable our dynamo backend returned, less the runtime wrapper (input
  picking, the frozen-weight and overlap checks, writing back, output structure);
* ``Dynamo``: ``model.forward`` less our callable (guards, the frame, the call into it);
* ``Hugging Face``: ``generate()`` less ``model.forward`` (logits processing, the cache
  object, stopping criteria).

Per token = (time of N new tokens - time of 1) / (N - 1), each layer alike. Eager and inductor
(``torch.compile`` with the static cache) run the same ``generate()`` in interleaved rounds.

Models: ``llama`` (8 layers, hidden 512, 8 heads / 2 key-value heads, vocabulary 32,000: the
issue's small decoder, :func:`bench.models.decoder.llama_small`) or ``qwen``
(:func:`bench.models.decoder.qwen2_0_5b`, ``--layers``). Each layer is timed by the harness's
nested timers (:func:`bench.harness.timer.timed`), each ``generate()`` by its stopwatch.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

import torch

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import timed, timed_call
from bench.models.decoder import generate, llama_small, prompt, qwen2_0_5b

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "eager"
_SPENT: dict[str, float] = {}
LAYERS = ("runtime", "tensors", "our call", "Dynamo", "Hugging Face")


def _timed(name: str, fn: Any) -> Any:
    return timed(fn, _SPENT, name)


def _instrument() -> None:
    """Timers around the runtimes' own inference, our runtime wrappers and our callables."""
    import onnxruntime

    from embedl_dynamo.dynamo import entry_points
    from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime

    session = onnxruntime.InferenceSession
    session.run = _timed("runtime", session.run)
    session.run_with_iobinding = _timed("runtime", session.run_with_iobinding)
    runtimes = [OnnxRuntime]
    try:
        import openvino

        from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime

        openvino.InferRequest.infer = _timed("runtime", openvino.InferRequest.infer)
        runtimes.append(OpenVINORuntime)
    except ImportError:
        pass
    for runtime in runtimes:
        runtime._infer = _timed("tensors", runtime._infer)
        runtime._infer_in_place = _timed("tensors", runtime._infer_in_place)
    compile_subgraph = entry_points.compile_subgraph
    entry_points.compile_subgraph = lambda *a: _timed("our call", compile_subgraph(*a))


def _variant(name: str, args: argparse.Namespace):
    model = llama_small() if args.model == "llama" else qwen2_0_5b(args.layers)
    kw = {"cache_implementation": "static"} if args.cache == "static" else {}
    if name == "inductor":
        model.forward = torch.compile(model.forward)
    elif name == "ours":
        options = {"precision": args.precision}
        if args.precision.endswith("weight_only"):
            options["accuracy_budget"] = 0.5  # random weights: see the llm_decode suite
        compiled = torch.compile(model.forward, backend=args.backend, options=options)
        model.forward = _timed("forward", compiled)
    return model, kw


def _per_token(model, kw, ids, new_tokens: int) -> dict[str, float]:
    """ms per token of ``generate()`` and of each timed layer."""
    _SPENT.clear()
    one = {"generate": timed_call(generate, model, ids, 1, **kw)[1], **_SPENT}
    _SPENT.clear()
    many = {"generate": timed_call(generate, model, ids, new_tokens, **kw)[1], **_SPENT}
    return {k: (many[k] - one.get(k, 0.0)) / (new_tokens - 1) * 1e3 for k in many}


def _layers(spent: dict[str, float]) -> dict[str, float]:
    """Each layer's own ms per token (the outer timer less the inner one)."""
    get = lambda k: spent.get(k, 0.0)  # noqa: E731
    return {
        "runtime": get("runtime"),
        "tensors": get("tensors") - get("runtime"),
        "our call": get("our call") - get("tensors"),
        "Dynamo": get("forward") - get("our call"),
        "Hugging Face": get("generate") - get("forward"),
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--model", choices=("llama", "qwen"), default="llama")
    parser.add_argument("--layers", type=int, default=24, help="qwen's layers")
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    parser.add_argument("--new-tokens", type=int, default=49)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["eager", "inductor", "ours"])


def smoke(args: argparse.Namespace) -> None:
    """Qwen's shape at 1 layer, 5 new tokens, one round, eager against ours."""
    args.model, args.layers, args.new_tokens, args.rounds = "qwen", 1, 5, 1
    args.variants = ["eager", "ours"]


def run(args: argparse.Namespace, record: Record) -> None:
    """Build each variant, then rounds of ``generate()`` with every layer timed."""
    _instrument()
    ids = prompt(32)
    built = {name: _variant(name, args) for name in args.variants}
    for model, kw in built.values():  # builds and first recompiles, untimed
        generate(model, ids, 8, **kw), generate(model, ids, 8, **kw)
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(args.rounds):  # each generate() holds thousands of calls: no inner repeats
        for name, (model, kw) in built.items():
            results[name].append(_per_token(model, kw, ids, args.new_tokens))
    model_name = "llama_small" if args.model == "llama" else "qwen2_0_5b"
    params = {"cache": args.cache, "precision": args.precision}
    for name, rounds in results.items():
        total = statistics.median(r["generate"] for r in rounds)
        record.add(
            model_name,
            name,
            "per_token",
            total,
            "ms/token",
            params=params,
            info={"rounds": [round(r["generate"], 3) for r in rounds]},
        )
        if name == "ours":
            layers = [_layers(r) for r in rounds]
            for layer in LAYERS:
                value = statistics.median(one[layer] for one in layers)
                record.add(model_name, name, layer, value, "ms/token", params=params)


def table(record: Record, view: str = "main") -> str:
    """A line per variant: ms per token, and ours' layers."""
    return by_metric(record, ("per_token", *LAYERS))
