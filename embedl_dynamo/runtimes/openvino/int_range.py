"""The int64 inputs OpenVINO's CPU plugin computes exactly: it computes int64 as int32.

The guard's bound is what :mod:`embedl_dynamo.runtimes.conformance.int_bounds` assumes of a
graph's inputs and sizes when it proves that a sum fits int32."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from embedl_dynamo.errors import CallRefused
from embedl_dynamo.runtimes.conformance.int_bounds import GUARDED_RANGE

__all__ = ["check_int32_range"]

#: the int64 inputs OpenVINO takes: within half of int32's range, so that the sum or difference
#: of two of them still fits the int32 it computes them in
_INT64_LOW, _INT64_HIGH = GUARDED_RANGE


def check_int32_range(args: Sequence[torch.Tensor]) -> None:
    """Raise :class:`~embedl_dynamo.errors.CallRefused` when an int64 input holds a value
    outside half of int32's range: the CPU plugin computes int64 as int32 and would wrap it, or
    wrap the sum of two such values (2**31 - 1 + 1 gave -2**31), so such a call runs in PyTorch
    (:mod:`embedl_dynamo.runtimes.conformance`). Two reductions per int64 input (ids,
    positions, masks: small). A dimension of 2**30 or more is refused too: the graph's sizes
    are integers it computes with."""
    for position, t in enumerate(args):
        if any(size > _INT64_HIGH for size in t.shape):
            raise CallRefused(
                f"input {position} has a dimension of 2**30 or more, {tuple(t.shape)}: "
                "OpenVINO's CPU plugin computes int64 as int32, where sums of sizes would wrap"
            )
        if t.dtype == torch.int64 and t.numel():
            low, high = torch.aminmax(t)
            if low < _INT64_LOW or high > _INT64_HIGH:
                raise CallRefused(
                    f"input {position} holds int64 values outside [-2**30, 2**30), "
                    f"[{int(low)}, {int(high)}]: OpenVINO's CPU plugin computes int64 as int32, "
                    "where they or their sums would wrap"
                )
