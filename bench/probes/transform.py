"""Time the graph pipeline on a ResNet-50-sized graph: trace, plan, apply (medians).

Target: the whole transform (``trace`` + ``get_transformation_plan`` +
``apply_transformation_plan``) under 0.5 s on the 2-core CI machine. Shapes come from one
ShapeProp pass over a 224x224 input, which ``trace`` runs when given example inputs; the row
of ``trace`` includes it. The model is the plain ``torch.nn`` ResNet-50 (``resnet50_nn``).
``--profile`` prints cProfile's 25 costliest calls of one whole transform.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import interleaved
from bench.models.resnet import resnet50

__all__ = ["BASELINE", "TARGET_S", "arguments", "run", "smoke", "table"]

BASELINE = None
TARGET_S = 0.5


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one full transform")


def smoke(args: argparse.Namespace) -> None:
    """One repeat."""
    args.repeat = 1


def run(args: argparse.Namespace, record: Record) -> None:
    """Trace, plan, apply and the whole transform, each timed ``--repeat`` times."""
    from embedl_dynamo import apply_transformation_plan, get_transformation_plan, trace, transform
    from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS as patterns

    model = resnet50()
    x = torch.randn(1, 3, 224, 224)
    get_transformation_plan(model, patterns, (x,))  # warm-up: pattern compilation is cached
    traced = trace(model, (x,))
    plan = get_transformation_plan(traced, patterns)
    result = apply_transformation_plan(plan)
    stages = {
        "trace (+ShapeProp)": lambda: trace(model, (x,)),
        # from the traced copy (it deep-copies again, as it would any GraphModule it is given)
        "get_transformation_plan": lambda: get_transformation_plan(traced, patterns),
        "apply_transformation_plan": lambda: apply_transformation_plan(plan),
        "whole transform()": lambda: transform(model, (x,), patterns),
    }
    timings = interleaved(stages, args.repeat, warmup=0, repeat=1, pause_s=0.0)
    with torch.no_grad():
        diff = (result.model(x) - model(x)).abs().max().item()
    nodes = sum(1 for _ in traced.graph.nodes)
    info = {
        "nodes": nodes,
        "plan_entries": len(plan.entries),
        "applied": result.report["applied_count"],
        "max_abs_diff": diff,
    }
    for stage in stages:
        record.add(
            "resnet50_nn",
            stage,
            "time",
            timings.median(stage),
            "s",
            info=info if stage == "whole transform()" else None,
        )
    whole = timings.median("whole transform()")
    record.notes.append(f"target < {TARGET_S} s: {whole / TARGET_S:.2f}x of the target")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        stages["whole transform()"]()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def table(record: Record, view: str = "main") -> str:
    """A line per stage: its median seconds."""
    return by_metric(record, ("time",), labels={"time": "median s"})
