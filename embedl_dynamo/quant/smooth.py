"""Run the Backend's ``smooth_patterns`` (SmoothQuant) on a graph before QDQ placement.

Collects the per-channel ``max |y|`` of each matched LayerNorm output over the calibration
data (one extra pass, only when a pattern matches), then lets each pattern rewrite its match.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.graph.nodes import module_path
from embedl_dynamo.quant.calibrate import calibrate
from embedl_dynamo.rewrite.matcher import escaping_node, find_matches
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["ChannelAbsMax", "apply_smoothing"]


class ChannelAbsMax(nn.Module):
    """Identity that records ``max |x|`` per channel of the last dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.absmax: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0)
        self.absmax = current if self.absmax is None else torch.maximum(self.absmax, current)
        return x


def apply_smoothing(gm: fx.GraphModule, patterns: Sequence[Pattern], data: Any) -> list[str]:
    """Smooth ``gm`` in place with ``patterns``; ``data`` as for calibration.

    Returns:
        The ids of the rewritten matches.
    """
    matches = []
    module_matches = []
    for pattern in patterns:
        for m in find_matches(pattern, gm):
            if escaping_node(m) is None and pattern.check(m).ok:
                matches.append(m)
        if hasattr(pattern, "match_modules"):
            for ln_node, users, reason in pattern.match_modules(gm):
                if not reason:
                    module_matches.append((pattern, ln_node, users))
    if not matches and not module_matches:
        return []
    observed = copy.deepcopy(gm)
    nodes = {n.name: n for n in observed.graph.nodes}
    recorders: dict[str, ChannelAbsMax] = {}
    names = [m["ln"].name for m in matches] + [ln.name for _, ln, _ in module_matches]
    for name in names:
        if name in recorders:
            continue
        recorders[name] = ChannelAbsMax()
        attr = f"_smooth_absmax_{name}"
        observed.add_module(attr, recorders[name])
        with observed.graph.inserting_after(nodes[name]):
            rec = observed.graph.call_module(attr, (nodes[name],))
        nodes[name].replace_all_uses_with(rec, delete_user_cb=lambda u, r=rec: u is not r)
    observed.recompile()
    calibrate(observed, data, progress=False)
    done = []
    for m in matches:
        m.pattern.rewrite(m, recorders[m["ln"].name].absmax)
        done.append(m.id)
    for pattern, ln_node, users in module_matches:
        pattern.rewrite_modules(gm, ln_node, users, recorders[ln_node.name].absmax)
        done.append(f"{pattern.name}@{module_path(ln_node) or ln_node.name}")
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return done
