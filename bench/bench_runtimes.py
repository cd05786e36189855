"""ONNX Runtime vs OpenVINO as the runtime behind ``embedl_tensorrt`` on this CPU.

Same ONNX artifact, two runtimes, interleaved timings in one process, medians as ratios to eager
measured in the same run. Decides whether ``runtime="auto"`` should prefer OpenVINO on x86.

    python bench/bench_runtimes.py            # ResNet-50 (224) and a BERT-base-sized encoder
    python bench/bench_runtimes.py --quick    # smaller inputs / fewer layers, fewer repeats
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.models import resnet50  # noqa: E402


def bert_like(layers: int) -> nn.Module:
    """A BERT-base-sized encoder (hidden 768, 12 heads, MLP 3072, GELU) with random weights."""
    layer = nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def run(name: str, model: nn.Module, x: torch.Tensor, repeats: int, cache: str) -> None:
    variants: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"eager": model}
    first_call = {}
    for runtime in ("onnxruntime", "openvino"):
        torch._dynamo.reset()
        options = {"runtime": runtime, "cache_dir": cache}
        compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
        with torch.no_grad():
            first_call[runtime] = _time(lambda c=compiled: c(x)) / 1e3
        variants[runtime] = compiled
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.no_grad():
        reference = model(x)
        for fn in variants.values():
            fn(x)  # warm-up
        for _ in range(repeats):  # interleaved: the same machine state for every variant
            for key, fn in variants.items():
                times[key].append(_time(lambda f=fn: f(x)))
        errors = {k: float((fn(x) - reference).abs().max()) for k, fn in variants.items()}
    eager = statistics.median(times["eager"])
    print(f"\n{name}  input {tuple(x.shape)}  {torch.get_num_threads()} threads, {repeats} runs")
    print(
        f"{'variant':<12} {'median ms':>10} {'x eager':>8} {'first call s':>13} {'max |diff|':>11}"
    )
    for key in variants:
        median = statistics.median(times[key])
        first = f"{first_call[key]:.1f}" if key in first_call else "-"
        print(f"{key:<12} {median:>10.1f} {median / eager:>8.2f} {first:>13} {errors[key]:>11.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 20
    with tempfile.TemporaryDirectory() as cache:
        size = 128 if args.quick else 224
        run("ResNet-50", resnet50(), torch.randn(1, 3, size, size), repeats, cache)
        layers = 2 if args.quick else 12
        run(f"BERT-like encoder ({layers} layers)", bert_like(layers), torch.randn(1, 128, 768),
            repeats, cache)  # fmt: skip


if __name__ == "__main__":
    main()
