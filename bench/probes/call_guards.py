"""Per-call cost of the guards a compiled call runs (issues 39 and 50): the frozen-weight
check (identity, version, address, sampled bytes), the non-finite input guard (a convolution
or pooling window spreads or drops NaN on both CPU runtimes, so such a graph refuses calls
with NaN or infinities) and the overlap check of written inputs.

For a ResNet-50 layout (``resnet50_nn``: 25.6 M parameters, 320 weight tensors) and a tiny
MLP, compiled for OpenVINO (``--runtime``) at batch 1, it times, alternating call by call
(``--pairs`` rounds of the one timer, no pause: neighbouring calls see the same load):

* ``full``: the compiled call as shipped;
* ``id+version``: the same call with the check as it was before ``.data`` writes were seen
  (identity and version counter only);
* ``no finite guard``: the call as shipped but for the non-finite input guard, which passes
  every input unread;

each median, the median paired difference, and the checks alone on the model's own weights
(each the mean of 2,000 calls). The overlap check is timed on 2 inputs and on 50 (a decoder
step's KV cache). Run it with a fresh cache (``EMBEDL_DYNAMO_CACHE_DIR=$(mktemp -d)``).
"""

from __future__ import annotations

import argparse
import operator
import statistics
import warnings
from collections.abc import Callable

import torch
from torch import nn

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import interleaved
from bench.models.resnet import resnet50
from embedl_dynamo.dynamo import call_guards
from embedl_dynamo.dynamo.frozen_weights import FrozenWeights
from embedl_dynamo.dynamo.input_overlap import overlapping_input

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = None
_FULL_CHANGED = FrozenWeights.changed
_ALL_FINITE = call_guards.all_finite


def _id_version_only(self: FrozenWeights, args) -> str | None:
    """The check before issue 39: identity and version counter."""
    tensors = operator.itemgetter(*self.indices)(args)
    ids, versions = tuple(map(id, tensors)), tuple(map(operator.attrgetter("_version"), tensors))
    if ids == self.ids and versions == self.versions and not self.freed:
        return None
    return "a weight"


def _per_call_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Microseconds per call: the mean of ``calls`` calls in a row, after one."""
    timings = interleaved({"fn": fn}, 1, warmup=1, repeat=1, inner=calls, pause_s=0.0)
    return timings.median("fn") * 1e6


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--pairs", type=int, default=200, help="call pairs for ResNet-50")
    parser.add_argument("--runtime", default="openvino", choices=["openvino", "onnxruntime"])


def smoke(args: argparse.Namespace) -> None:
    """Five pairs."""
    args.pairs = 5


def _bench(record: Record, name: str, model: nn.Module, x, pairs: int, runtime: str) -> None:
    compiled = torch.compile(model, backend=f"embedl_{runtime}", options={"runtime": runtime})
    with torch.no_grad():
        for _ in range(5):
            compiled(x)

    def with_checks(changed, finite):
        def call() -> object:
            FrozenWeights.changed, call_guards.all_finite = changed, finite
            return compiled(x)

        return call

    calls = {
        "full": with_checks(_FULL_CHANGED, _ALL_FINITE),
        "id+version": with_checks(_id_version_only, _ALL_FINITE),
        "no finite guard": with_checks(_FULL_CHANGED, lambda tensor: True),
    }
    try:
        timings = interleaved(calls, pairs, warmup=0, repeat=1, pause_s=0.0, mode=torch.no_grad)
    finally:
        FrozenWeights.changed, call_guards.all_finite = _FULL_CHANGED, _ALL_FINITE
    for variant in calls:
        record.add(name, variant, "call", timings.median(variant) * 1e3, "ms")
    for other in ("id+version", "no finite guard"):
        paired = [a - b for a, b in zip(timings.samples("full"), timings.samples(other))]
        record.add(name, f"full - {other}", "paired", statistics.median(paired) * 1e6, "us")
    record.add(name, "finite guard", "check", _per_call_us(lambda: _ALL_FINITE(x)), "us")
    weights = [*model.parameters(), *model.buffers()]
    frozen = FrozenWeights(weights, [])
    checks = {
        "full": lambda: _FULL_CHANGED(frozen, weights),
        "id+version": lambda: _id_version_only(frozen, weights),
        "sampled bytes": frozen.sample.unchanged,
    }
    for variant, check in checks.items():
        record.add(
            name, variant, "check", _per_call_us(check), "us", info={"weights": len(weights)}
        )


def run(args: argparse.Namespace, record: Record) -> None:
    """The MLP, ResNet-50, then the overlap check."""
    warnings.simplefilter("ignore")
    _bench(record, "mlp", _mlp(), torch.randn(1, 32), args.pairs * 20, args.runtime)
    _bench(record, "resnet50_nn", resnet50(), torch.randn(1, 3, 224, 224), args.pairs, args.runtime)
    for count in (2, 50):
        inputs = [torch.zeros(1, 8, 256, 64) for _ in range(count)]
        written = list(range(count - 2))
        us = _per_call_us(lambda i=inputs, w=written: overlapping_input(i, w))
        record.add(
            f"{count} inputs", "overlap check", "check", us, "us", info={"written": len(written)}
        )


def table(record: Record, view: str = "main") -> str:
    """A line per model and variant: the call, the paired difference, the check alone."""
    return by_metric(record, ("call", "paired", "check"))
