"""Time the graph pipeline on a ResNet-50-sized graph: trace, plan, apply (median of N runs).

Target: the whole transform (``trace`` + ``get_transformation_plan`` +
``apply_transformation_plan``) under 0.5 s on the 2-core CI machine. Usage::

    python bench/bench_transform.py [--repeat 5] [--profile]

Shapes come from one ShapeProp pass over a 224x224 input, which ``trace`` runs when given
example inputs; the table reports it as part of ``trace``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.models import resnet50  # noqa: E402
from embedl_dynamo import (  # noqa: E402
    apply_transformation_plan,
    get_transformation_plan,
    trace,
    transform,
)
from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS  # noqa: E402

TARGET_S = 0.5


def _median(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one full transform")
    args = parser.parse_args()

    model = resnet50()
    x = torch.randn(1, 3, 224, 224)
    patterns = COMMON_FUSION_PATTERNS
    get_transformation_plan(model, patterns, (x,))  # warm-up: pattern compilation is cached

    t_trace, traced = _median(lambda: trace(model, (x,)), args.repeat)
    # from the traced copy (it deep-copies again, as it would any GraphModule it is given)
    t_plan, plan = _median(lambda: get_transformation_plan(traced, patterns), args.repeat)
    t_apply, result = _median(lambda: apply_transformation_plan(plan), args.repeat)

    def full():
        return transform(model, (x,), patterns)  # what users call: trace, plan, apply

    t_full, _ = _median(full, args.repeat)
    with torch.no_grad():
        diff = (result.model(x) - model(x)).abs().max().item()

    nodes = sum(1 for _ in traced.graph.nodes)
    print(f"ResNet-50 224x224: {nodes} traced nodes, {len(plan.entries)} plan entries, "
          f"{result.report['applied_count']} applied; max |diff| {diff:.2e}")  # fmt: skip
    print(f"{'stage':<28}{'median s':>10}")
    for name, t in (
        ("trace (+ShapeProp)", t_trace),
        ("get_transformation_plan", t_plan),
        ("apply_transformation_plan", t_apply),
        ("whole transform()", t_full),
    ):
        print(f"{name:<28}{t:>10.3f}")
    verdict = "OK" if t_full < TARGET_S else "SLOWER THAN TARGET"
    print(f"target < {TARGET_S} s: {verdict} ({t_full / TARGET_S:.2f}x of the target)")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        full()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
