"""Whether a call's inputs overlap in memory where the artifact assumes they do not.

A graph that writes an input in place is made functional on the first call's inputs
(:mod:`embedl_dynamo.graph.functionalize`), which did not overlap: ``a.add_(1); return b * 2``
reads the old ``b``. Called later with views of one tensor (``f(big[:4], big[1:])``), eager's
write into ``a`` shows in ``b``; the artifact's does not. So each call of such a graph checks,
before the runtime runs, whether a written input shares memory with another input, and such a
call runs the original graph in PyTorch.

The check compares byte ranges (the first to the last byte each tensor spans), so views whose
elements interleave without sharing one (``x[:, 0]`` and ``x[:, 1]``) count as overlapping: a
call that runs in PyTorch though it need not, never a wrong one. Addresses are compared
whatever the device (CUDA's unified addressing keeps them apart). An empty tensor overlaps
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from embedl_dynamo.dynamo.frozen_weights import byte_span

__all__ = ["overlapping_input"]


def _ranges(inputs: Sequence[Any]) -> list[tuple[int, int, int]]:
    """(first byte address, end address, position) of each tensor input with memory."""
    found = []
    for position, value in enumerate(inputs):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            start, length = value.data_ptr(), byte_span(value)[1]
            if length:
                found.append((start, start + length, position))
    return found


def overlapping_input(inputs: Sequence[Any], written: Sequence[int]) -> int | None:
    """The position of a written input whose memory overlaps another input's, or None.

    Ranges are sorted by address and swept once: a run of ranges each starting before the
    furthest end so far shares memory, and is reported when it holds a written input.
    """
    if not written:
        return None
    writes = set(written)
    group: list[int] = []
    end = -1
    for start, stop, position in sorted(_ranges(inputs)):
        if start < end:
            group.append(position)
            end = max(end, stop)
            continue
        hit = _written_in(group, writes)
        if hit is not None:
            return hit
        group, end = [position], stop
    return _written_in(group, writes)


def _written_in(group: list[int], writes: set[int]) -> int | None:
    if len(group) < 2:
        return None
    return next((p for p in group if p in writes), None)
