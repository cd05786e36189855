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
issue's small decoder) or ``qwen`` (:func:`bench.bench_llm.qwen2_0_5b`, ``--layers``).

Usage: ``python -m bench.decode_overhead [--model llama] [--backend embedl_onnxruntime]
[--precision fp32] [--cache dynamic|static] [--new-tokens 49] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from bench.bench_llm import generate, qwen2_0_5b

_SPENT: dict[str, float] = defaultdict(float)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _SPENT[name] += time.perf_counter() - start

    return timed


def llama():
    import transformers

    from bench.zoo import import_model_libraries

    import_model_libraries()
    config = transformers.LlamaConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=32000, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


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
    model = llama() if args.model == "llama" else qwen2_0_5b(args.layers)
    kw = {"cache_implementation": "static"} if args.cache == "static" else {}
    if name == "inductor":
        model.forward = torch.compile(model.forward)
    elif name == "ours":
        options = {"precision": args.precision}
        if args.precision.endswith("weight_only"):
            options["accuracy_budget"] = 0.5  # random weights: see bench_llm
        compiled = torch.compile(model.forward, backend=args.backend, options=options)
        model.forward = _timed("forward", compiled)
    return model, kw


def _per_token(model, kw, ids, new_tokens: int) -> dict[str, float]:
    """ms per token of ``generate()`` and of each timed layer."""
    _SPENT.clear()
    start = time.perf_counter()
    generate(model, ids, 1, **kw)
    one = {"generate": time.perf_counter() - start, **_SPENT}
    _SPENT.clear()
    start = time.perf_counter()
    generate(model, ids, new_tokens, **kw)
    many = {"generate": time.perf_counter() - start, **_SPENT}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("llama", "qwen"), default="llama")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    parser.add_argument("--new-tokens", type=int, default=49)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["eager", "inductor", "ours"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    _instrument()
    ids = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    models = {name: _variant(name, args) for name in args.variants}
    for model, kw in models.values():  # builds and first recompiles, untimed
        generate(model, ids, 8, **kw), generate(model, ids, 8, **kw)
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, (model, kw) in models.items():
            results[name].append(_per_token(model, kw, ids, args.new_tokens))
    for name, rounds in results.items():
        total = statistics.median(r["generate"] for r in rounds)
        each = ", ".join(f"{r['generate']:.2f}" for r in rounds)
        line = f"{name}: {total:.2f} ms/token (rounds {each})"
        if name == "ours":
            layers = [_layers(r) for r in rounds]
            parts = {k: statistics.median(layer[k] for layer in layers) for k in layers[0]}
            line += "; " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        print(line)


if __name__ == "__main__":
    main()
