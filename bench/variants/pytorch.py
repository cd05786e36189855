"""PyTorch's own variants: ``eager`` (the baseline of every suite) and ``inductor``
(``torch.compile`` with ``torch._inductor.config.freezing = True``, what a PyTorch user would
turn on for inference)."""

from __future__ import annotations

import torch

from bench.variants import Built, Case

__all__ = ["build", "inductor"]


def inductor(model: torch.nn.Module, inputs: tuple) -> Built:
    """``torch.compile(model)`` with inductor's freezing on (the call, not yet called)."""
    torch._inductor.config.freezing = True
    compiled = torch.compile(model, backend="inductor")
    return Built(lambda: compiled(*inputs), tool=f"inductor (torch {torch.__version__})")


def build(case: Case, name: str) -> Built:
    """``eager`` or ``inductor`` for ``case``."""
    if name == "eager":
        model, inputs = case.model, case.inputs
        return Built(lambda: model(*inputs))
    return inductor(case.model, case.inputs)
