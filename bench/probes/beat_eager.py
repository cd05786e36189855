"""Beats eager, or eager runs (``beat_eager``): what the rule decides and what a call costs.

On graphs whose ops a runtime runs slower than PyTorch (``grid_sample``, ``scatter_add``,
bicubic upsampling) and on a small CNN the runtimes win, each case is compiled with
``embedl_tensorrt`` under ``runtime="auto"`` twice, with ``beat_eager=True`` (the default) and
``False``, and timed against eager PyTorch by the one timer, with Dynamo's own ``eager``
backend beside them (``dynamo``: what any compiled call costs over eager, its guards, where
PyTorch runs it). The row of ``ours beat_eager=True`` says what the rule decided. Run it with
a fresh cache (``EMBEDL_DYNAMO_CACHE_DIR=$(mktemp -d)``) and ``--threads 1``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from bench.harness.record import Record
from bench.harness.table import by_variant
from bench.harness.timer import interleaved
from bench.variants.ours import compile_ours

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "eager"


class GridSample(nn.Module):
    def forward(self, x, grid):
        return F.grid_sample(x, grid, align_corners=False).relu() * 2


class ScatterAdd(nn.Module):
    def forward(self, x, index):
        return torch.zeros(64, x.shape[1]).scatter_add(0, index, x).relu() * 2


class Bicubic(nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=2, mode="bicubic").relu() * 2


def _cases() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    from tests.models import ResNetLike, randomize_batchnorm

    torch.manual_seed(0)
    return {
        "grid_sample 2x16x64x64": (
            GridSample(),
            (torch.randn(2, 16, 64, 64), torch.rand(2, 64, 64, 2) * 2 - 1),
        ),
        "scatter_add 4096x512": (
            ScatterAdd(),
            (torch.randn(4096, 512), torch.randint(0, 64, (4096, 512))),
        ),
        "bicubic x2 1x16x64x64": (Bicubic(), (torch.randn(1, 16, 64, 64),)),
        "ResNetLike 2x3x32x32": (
            randomize_batchnorm(ResNetLike().eval()),
            (torch.randn(2, 3, 32, 32),),
        ),
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")


def smoke(args: argparse.Namespace) -> None:
    """Two rounds of the small CNN."""
    args.rounds, args.cases = 2, "ResNetLike 2x3x32x32"


def run(args: argparse.Namespace, record: Record) -> None:
    """Each case: eager, Dynamo's eager backend, ours with and without the rule."""
    wanted = [c for c in args.cases.split(",") if c]
    for name, (model, inputs) in _cases().items():
        if wanted and name not in wanted:
            continue
        model.eval()
        dynamo = torch.compile(model, backend="eager")
        calls = {
            "eager": lambda m=model, i=inputs: m(*i),
            "dynamo": lambda d=dynamo, i=inputs: d(*i),
        }
        decided = {}
        for flag in (True, False):
            compiled = compile_ours(
                model, inputs, {"beat_eager": flag, "num_threads": args.threads}
            )
            calls[f"ours beat_eager={flag}"] = compiled.call
            if flag:
                (sub,) = compiled.report.subgraphs
                decided = {"decided": f"{sub.runtime}: {sub.reason}"}
        timings = interleaved(calls, args.rounds, mode=torch.no_grad)
        for variant in calls:
            info = decided if variant == "ours beat_eager=True" else None
            ms = timings.median(variant) * 1e3
            record.add(name, variant, "latency", ms, "ms", info=info)
        torch._dynamo.reset()


def table(record: Record, view: str = "main") -> str:
    """A line per case: eager ms and each variant's time over it."""
    lines = [by_variant(record, "latency"), "", "Decided (beat_eager=True):", ""]
    for row in record.find(variant="ours beat_eager=True", metric="latency"):
        lines.append(f"- {row['model']}: {(row.get('info') or {}).get('decided', '-')}")
    return "\n".join(lines)
