"""Per-call cost of the guards a compiled call runs (issue 39): the frozen-weight check
(identity, version, address, sampled bytes) and the overlap check of written inputs.

For a ResNet-50 layout (25.6 M parameters, 320 weight tensors) and a tiny MLP, compiled for
OpenVINO (``--runtime``) at batch 1, it times, interleaved in one process:

* ``full``: the compiled call as shipped;
* ``id+version``: the same call with the check as it was before ``.data`` writes were seen
  (identity and version counter only);

alternating call by call (each median and the median paired difference), and the checks
alone, on the model's own weights. The overlap check is timed on 2 inputs and
on 50 (a decoder step's KV cache).

    EMBEDL_DYNAMO_CACHE_DIR=$(mktemp -d) python -m bench.bench_call_guards [--pairs 200]
"""

from __future__ import annotations

import argparse
import operator
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from bench.models import resnet50
from embedl_dynamo.dynamo.frozen_weights import FrozenWeights
from embedl_dynamo.dynamo.input_overlap import overlapping_input

_FULL_CHANGED = FrozenWeights.changed


def _id_version_only(self: FrozenWeights, args) -> str | None:
    """The check before issue 39: identity and version counter."""
    tensors = operator.itemgetter(*self.indices)(args)
    ids, versions = tuple(map(id, tensors)), tuple(map(operator.attrgetter("_version"), tensors))
    if ids == self.ids and versions == self.versions and not self.freed:
        return None
    return "a weight"


def _per_call_us(fn: Callable[[], object], calls: int = 2000) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()


def _paired_ms(fns: dict[str, Callable[[], object]], pairs: int) -> dict[str, float]:
    """Median ms per call of each variant, the variants alternating call by call (a shared,
    loaded machine drifts; neighbouring calls see the same load), and the median paired
    difference of the first minus the second."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    differences = []
    first, second = list(fns)
    with torch.no_grad():
        for _ in range(pairs):
            pair = {}
            for key in (first, second):
                start = time.perf_counter()
                fns[key]()
                pair[key] = time.perf_counter() - start
                samples[key].append(pair[key])
            differences.append(pair[first] - pair[second])
    medians = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    medians["difference"] = statistics.median(differences) * 1e3
    return medians


def _bench(name: str, model: nn.Module, x: torch.Tensor, pairs: int, runtime: str) -> None:
    options = {"runtime": runtime}
    compiled = torch.compile(model, backend=f"embedl_{runtime}", options=options)
    with torch.no_grad():
        for _ in range(5):
            compiled(x)

    def with_check(changed):
        def call() -> object:
            FrozenWeights.changed = changed
            return compiled(x)

        return call

    ms = _paired_ms(
        {"full": with_check(_FULL_CHANGED), "id+version": with_check(_id_version_only)}, pairs
    )
    FrozenWeights.changed = _FULL_CHANGED
    weights = [*model.parameters(), *model.buffers()]
    frozen = FrozenWeights(weights, [])
    full = _per_call_us(lambda: _FULL_CHANGED(frozen, weights))
    old = _per_call_us(lambda: _id_version_only(frozen, weights))
    sample = _per_call_us(frozen.sample.unchanged)
    print(
        f"{name} ({runtime}): {len(weights)} weights; call with the checks {ms['full']:.3f} ms, "
        f"id+version only {ms['id+version']:.3f} ms, ratio {ms['full'] / ms['id+version']:.3f}, "
        f"median paired difference {ms['difference'] * 1e3:.1f} us; checks alone {full:.1f} us "
        f"(id+version {old:.1f} us, sampled bytes {sample:.1f} us)"
    )


def _bench_overlap() -> None:
    for count in (2, 50):
        inputs = [torch.zeros(1, 8, 256, 64) for _ in range(count)]
        written = list(range(count - 2))
        us = _per_call_us(lambda i=inputs, w=written: overlapping_input(i, w))
        print(f"overlap check, {count} inputs ({len(written)} written): {us:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="call pairs for ResNet-50")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runtime", default="openvino", choices=["openvino", "onnxruntime"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    _bench("tiny MLP", _mlp(), torch.randn(1, 32), args.pairs * 20, args.runtime)
    _bench("ResNet-50", resnet50(), torch.randn(1, 3, 224, 224), args.pairs, args.runtime)
    _bench_overlap()


if __name__ == "__main__":
    main()
