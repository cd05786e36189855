"""Running a graph as the reference a runtime's artifact is judged against: no grad, IEEE
float32, and past the call wrapper FX gives a GraphModule (which prints the code around a
failing line to stderr, where a failure here is an expected fallback said in one line)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.graph.float32 import exact_float32

__all__ = ["graph_call", "graph_outputs"]


def graph_outputs(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``gm``'s outputs on ``inputs`` (no grad, IEEE float32) as a tuple (:func:`graph_call`)."""
    with torch.no_grad(), exact_float32():
        out = graph_call(gm, inputs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def graph_call(model: Callable[..., Any], inputs: Sequence[Any]) -> Any:
    """``model(*inputs)``; a module through ``nn.Module.__call__`` (its hooks run), past the
    call wrapper FX gives a GraphModule, which prints the code around a failing line."""
    return nn.Module.__call__(model, *inputs) if isinstance(model, nn.Module) else model(*inputs)
