"""The ambient state that changes what a graph computes, as a key part.

The same Dynamo graph computes other numbers under ``torch.autocast`` or another default dtype,
and its export is another file: Dynamo guards on that state and hands the backend the graph again,
so every key derived from a graph (:func:`~embedl_dynamo.cache.keys.fingerprint_graph`: the ONNX
artifact, a warm start's alias, a calibration) holds :func:`numerics_state`, and an artifact built
under one state is never found, nor stored, under another's key.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["AUTOCAST_DEVICES", "numerics_state"]

#: the device types whose autocast state a fingerprint reads (one not built in is skipped)
AUTOCAST_DEVICES = (
    "cpu",
    "cuda",
    "xpu",
    "mps",
    "hpu",
    "xla",
    "ipu",
    "mtia",
    "maia",
    "privateuseone",
)


def numerics_state() -> dict[str, Any]:
    """This thread's settings that change what running or exporting a graph computes.

    The default dtype (a factory op without a dtype, such as ``torch.ones(n)``, takes it) and,
    per device type where autocast is enabled, autocast's dtype: Dynamo hands a backend the same
    graph under ``torch.autocast("cpu", torch.bfloat16)`` as without it, and a graph run or
    exported under it computes in bf16. Grad mode and inference mode are left out: a graph
    built in either computes the same numbers (one that needs grad runs in PyTorch).

    Returns:
        ``{"default_dtype": ..., "autocast": {device: dtype}}``, ``autocast`` only when enabled
        on some device.
    """
    state: dict[str, Any] = {"default_dtype": str(torch.get_default_dtype())}
    autocast = {}
    for device in AUTOCAST_DEVICES:
        try:
            if torch.is_autocast_enabled(device):
                autocast[device] = str(torch.get_autocast_dtype(device))
        except RuntimeError:  # a device type this build of PyTorch does not know
            continue
    if autocast:
        state["autocast"] = autocast
    return state
