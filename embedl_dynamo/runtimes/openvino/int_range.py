"""The int64 inputs OpenVINO's CPU plugin computes exactly: it computes int64 as int32."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from embedl_dynamo.errors import CallRefused

__all__ = ["check_int32_range"]

#: the int64 inputs OpenVINO takes: within half of int32's range, so that the sum or difference
#: of two of them still fits the int32 it computes them in
_INT64_LOW, _INT64_HIGH = -(2**30), 2**30 - 1


def check_int32_range(args: Sequence[torch.Tensor]) -> None:
    """Raise :class:`~embedl_dynamo.errors.CallRefused` when an int64 input holds a value
    outside half of int32's range: the CPU plugin computes int64 as int32 and would wrap it, or
    wrap the sum of two such values (2**31 - 1 + 1 gave -2**31), so such a call runs in PyTorch
    (:mod:`embedl_dynamo.runtimes.conformance`). Two reductions per int64 input (ids,
    positions, masks: small)."""
    for position, t in enumerate(args):
        if t.dtype == torch.int64 and t.numel():
            low, high = torch.aminmax(t)
            if low < _INT64_LOW or high > _INT64_HIGH:
                raise CallRefused(
                    f"input {position} holds int64 values outside [-2**30, 2**30), "
                    f"[{int(low)}, {int(high)}]: OpenVINO's CPU plugin computes int64 as int32, "
                    "where they or their sums would wrap"
                )
