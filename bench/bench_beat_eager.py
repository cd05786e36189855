"""Beats eager, or eager runs (``beat_eager``): what the rule decides and what a call costs with
it and without it, on graphs whose ops a runtime runs slower than PyTorch (``grid_sample``,
``scatter_add``, bicubic upsampling) and on a small CNN the runtimes win.

Each case is compiled with ``embedl_tensorrt`` under ``runtime="auto"`` twice, with
``beat_eager=True`` (the default) and ``False``, and timed round-robin against eager PyTorch
in one process (:func:`bench.measure.round_robin_medians`), with Dynamo's own ``eager``
backend beside them: what any compiled call costs over eager (guards) where PyTorch runs it.

    EMBEDL_DYNAMO_CACHE_DIR=$(mktemp -d) python -m bench.bench_beat_eager [--threads 1]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from bench.measure import compile_ours, round_robin_medians
from tests.models import ResNetLike, randomize_batchnorm


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
    torch.manual_seed(0)
    return {
        "grid_sample 2x16x64x64": (
            GridSample(), (torch.randn(2, 16, 64, 64), torch.rand(2, 64, 64, 2) * 2 - 1)
        ),
        "scatter_add 4096x512": (
            ScatterAdd(), (torch.randn(4096, 512), torch.randint(0, 64, (4096, 512)))
        ),
        "bicubic x2 1x16x64x64": (Bicubic(), (torch.randn(1, 16, 64, 64),)),
        "ResNetLike 2x3x32x32": (
            randomize_batchnorm(ResNetLike().eval()), (torch.randn(2, 3, 32, 32),)
        ),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's and the runtimes'")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        "| graph | decided (beat_eager=True) | eager ms | runtime x eager | with the rule x eager "
        "| Dynamo's eager backend x eager |"
    )
    print("|---|---|---|---|---|---|")
    for name, (model, inputs) in _cases().items():
        model.eval()
        dynamo = torch.compile(model, backend="eager")
        fns = {"eager": lambda m=model, i=inputs: m(*i), "dynamo": lambda d=dynamo, i=inputs: d(*i)}
        decided = ""
        for flag in (True, False):
            options = {"beat_eager": flag, "num_threads": args.threads}
            compiled = compile_ours(model, inputs, options)
            fns[f"beat_eager={flag}"] = compiled.call
            if flag:
                (sub,) = compiled.report.subgraphs
                decided = f"{sub.runtime}: {sub.reason}"
        medians = round_robin_medians(fns, args.rounds)
        eager = medians["eager"]
        print(
            f"| {name} | {decided} | {eager * 1e3:.2f} | "
            f"{medians['beat_eager=False'] / eager:.2f}x | {medians['beat_eager=True'] / eager:.2f}x "
            f"| {medians['dynamo'] / eager:.2f}x |"
        )
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
