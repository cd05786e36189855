"""The ``eager`` runtime: run the transformed GraphModule in PyTorch (always available)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from embedl_dynamo.runtimes.base import Runtime

__all__ = ["EagerRuntime"]


class EagerRuntime(Runtime):
    """Runs the transformed (fused, frozen) GraphModule under ``torch.no_grad``."""

    name = "eager"
    auto_rank = -1  # always available: the last resort of ``auto``

    @classmethod
    def cuda_missing(cls) -> str | None:
        return None  # PyTorch runs the graph where its tensors are

    @property
    def device(self) -> torch.device:
        """Where the graph's tensors are (the CPU before a build)."""
        return getattr(self, "_device", torch.device("cpu"))

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        self._gm = gm
        tensors = [*example_inputs, *gm.parameters(), *gm.buffers()]
        self._device = next((t.device for t in tensors), torch.device("cpu"))
        self.build_info = {"nodes": len(gm.graph.nodes)}

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            out = self._gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
