"""Whether a tensor holds NaN or an infinity, cheaply enough for a check on every call.

The per-call guards (:mod:`embedl_dynamo.dynamo.call_guards`, load()'s
:mod:`embedl_dynamo.deploy.non_finite`) read every float input once before a runtime runs:
on the CPU through numpy's ``min`` and ``max`` (NaN propagates through both) on one thread and
without a copy, since torch's own reduction wakes its thread pool, whose spinning threads then
compete with the runtime's for the cores during the inference that follows.
"""

from __future__ import annotations

import numpy
import torch

__all__ = ["all_finite"]

_NUMPY_FLOATS = (torch.float32, torch.float64)  # read through numpy on the CPU


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN or infinity (an integer or empty tensor: True)."""
    if not tensor.is_floating_point() or not tensor.numel():
        return True
    if tensor.device.type == "cpu" and tensor.dtype in _NUMPY_FLOATS:
        values = tensor.detach().numpy()
        return bool(numpy.isfinite(values.max()) and numpy.isfinite(values.min()))
    return bool(torch.isfinite(tensor).all())
