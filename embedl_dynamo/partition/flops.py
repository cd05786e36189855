"""FLOPs per node of a graph, counted by PyTorch's ``FlopCounterMode`` on real inputs.

Coverage is judged by compute, not only by node count: a partition that keeps one small op in
PyTorch and runs every convolution on the runtime covers nearly all of a model's FLOPs. The
graph runs once in PyTorch, each node asked for under its own counter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["node_flops"]


class _FlopCounter(fx.Interpreter):
    """Runs the graph and records the FLOPs of the nodes asked for."""

    def __init__(self, gm: fx.GraphModule, counted: set[fx.Node]) -> None:
        super().__init__(gm)
        self.counted = counted
        self.flops: dict[fx.Node, int] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n not in self.counted:
            return super().run_node(n)
        with FlopCounterMode(display=False) as counter:
            value = super().run_node(n)
        self.flops[n] = counter.get_total_flops()
        return value


def node_flops(
    gm: fx.GraphModule, inputs: Sequence[Any], nodes: Iterable[fx.Node]
) -> dict[fx.Node, int]:
    """The FLOPs each of ``nodes`` computes when ``gm`` runs on ``inputs`` (0 for ops PyTorch's
    counter has no formula for: elementwise ops, which are cheap beside matmuls and convs)."""
    counter = _FlopCounter(gm, set(nodes))
    with torch.no_grad():
        counter.run(*inputs)
    return counter.flops
