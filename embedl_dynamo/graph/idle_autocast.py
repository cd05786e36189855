"""Autocast regions that change nothing, dropped at freezing.

Models turn autocast off around numerically delicate code, so that a caller's mixed-precision
run keeps it in float32 (timm's EfficientViT attention, several normalisations):
``with torch.autocast(device_type=x.device.type, enabled=False): ...``. Dynamo records the
region as an ``_enter_autocast(device, dtype, False, cache)`` node and its ``_exit_autocast``.
Where autocast is off for that device while the graph is compiled, the region computes exactly
what the same ops compute outside it, so its two nodes carry nothing a runtime must reproduce;
left in the graph, they are ops no runtime takes and keep a node in PyTorch. Dynamo guards a
compiled graph on the autocast state (and the artifact cache keys it:
:mod:`embedl_dynamo.cache.numerics`), so a call under autocast gets a graph of its own, in
which such a region is kept. A region that turns autocast on keeps its nodes.
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["drop_idle_autocast"]

_ENTER = torch.amp.autocast_mode._enter_autocast
_EXIT = torch.amp.autocast_mode._exit_autocast


def _idle(node: fx.Node) -> bool:
    """Whether ``node`` enters a region that turns autocast off where it is off already."""
    if node.op != "call_function" or node.target is not _ENTER or len(node.args) < 3:
        return False
    device, enabled = node.args[0], node.args[2]
    if enabled is not False or not isinstance(device, str):
        return False
    try:
        return not torch.is_autocast_enabled(device)
    except RuntimeError:  # a device type this build does not know: keep the region
        return False


def drop_idle_autocast(graph: fx.Graph) -> int:
    """Remove each region of ``graph`` that turns autocast off where it is off already (its
    enter node and the exit nodes reading it); the number of regions removed.

    Example:
        >>> def f(x):
        ...     with torch.autocast("cpu", enabled=False):
        ...         return x + 1
        >>> gm = torch.fx.symbolic_trace(f)  # no region: symbolic_trace runs through it
        >>> drop_idle_autocast(gm.graph)
        0
    """
    dropped = 0
    for node in list(graph.nodes):
        if not _idle(node):
            continue
        exits = list(node.users)
        if any(u.op != "call_function" or u.target is not _EXIT or u.users for u in exits):
            continue  # read by something else than its exit: leave the region as it is
        for user in exits:
            graph.erase_node(user)
        graph.erase_node(node)
        dropped += 1
    return dropped
