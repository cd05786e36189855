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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

__all__ = ["call_flops", "node_flops"]


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


class _DispatchFlops(TorchDispatchMode):
    """Sums the FLOPs of every aten op that runs, by ``FlopCounterMode``'s formulas, without its
    module tracker (whose autograd hooks fail on some models under ``inference_mode``)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None:  # a composite op (linear under inference_mode): its parts count
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def call_flops(fn: Any, inputs: Sequence[Any]) -> int:
    """The FLOPs one call ``fn(*inputs)`` computes in PyTorch, every op counted as
    :func:`node_flops` counts a node's, whatever Dynamo would trace of it."""
    counter = _DispatchFlops()
    with torch.inference_mode(), counter:
        fn(*inputs)
    return counter.total
