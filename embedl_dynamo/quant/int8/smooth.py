"""SmoothQuant (phase ``smooth``): the rule protocol, LayerNorm -> Linear, and its runner.

Activations after a LayerNorm have a few outlier channels that ruin a per-tensor INT8 scale;
weights quantize per output channel and tolerate a larger range. Per input channel ``j`` of the
Linear, with ``a_j = max |y_j|`` over calibration data and ``w_j = max_i |W_ij|``::

    s_j = a_j ** alpha / w_j ** (1 - alpha)
    gamma' = gamma / s,   beta' = beta / s,   W'[:, j] = W[:, j] * s_j

so ``linear(layer_norm(x; gamma', beta'), W') == linear(layer_norm(x; gamma, beta), W)``
exactly in real arithmetic (float rounding only), while the activation range shrinks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.aliasing import keeps_side_effects
from embedl_dynamo.graph.nodes import module_path
from embedl_dynamo.patterns.attention import FusedLayerNorm, FusedQKVProjection
from embedl_dynamo.patterns.fused_modules import FusedLinear
from embedl_dynamo.quant.int8.calibrate import calibrate
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.matcher import find_matches, verdict
from embedl_dynamo.rewrite.pattern import MatchRule

__all__ = [
    "ChannelAbsMax",
    "SmoothLayerNormLinear",
    "SmoothingRule",
    "apply_smoothing",
    "smoothing_scales",
]


class SmoothingRule(MatchRule):
    """A scale migration (phase ``smooth``): find where an activation's per-channel range can
    move into the next weights, then rewrite with the observed ``max |y|`` per channel.

    Function matches come from ``target``/``check``; fused-module sites from
    :meth:`module_sites` (none by default).
    """

    phase: ClassVar[str] = "smooth"

    def observed(self, m: Match) -> fx.Node:
        """The node of ``m`` whose per-channel ``max |y|`` the rewrite needs."""
        raise NotImplementedError

    def rewrite(self, m: Match, act_absmax: torch.Tensor) -> None:
        """Rewrite the match in place with the observed ranges."""
        raise NotImplementedError

    def module_sites(self, gm: fx.GraphModule) -> list[tuple[fx.Node, list[fx.Node], str]]:
        """``(observed node, consumer nodes, reason)`` among fused modules; empty reason: go."""
        return []

    def rewrite_module_site(
        self, gm: fx.GraphModule, node: fx.Node, users: list[fx.Node], act_absmax: torch.Tensor
    ) -> None:
        """Rewrite one site of :meth:`module_sites` with the observed ranges."""
        raise NotImplementedError


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s_j = a_j^alpha / w_j^(1-alpha)`` per input channel, clamped away from 0 and inf."""
    a = act_absmax.double().clamp(min=1e-5)
    w = weight.detach().double().abs().amax(dim=0).clamp(min=1e-5)
    return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp(min=1e-5, max=1e5)


class SmoothLayerNormLinear(SmoothingRule):
    """Migrate activation outliers from a LayerNorm's output into the next Linear's weight.

    Args:
        alpha: migration strength in [0, 1]; 0.5 is SmoothQuant's default.
    """

    name = "smooth_layernorm_linear"
    id_node = "linear"

    def __init__(self, alpha: float = 0.5) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = float(alpha)

    @staticmethod
    def target(x, shape, gamma, beta, w, b):
        ln = F.layer_norm(x, shape, gamma, beta)
        out = F.linear(ln, w, b)
        return out, {"ln": ln, "linear": out}

    def observed(self, m: Match) -> fx.Node:
        return m["ln"]

    def check(self, m: Match) -> MatchResult:
        if m["gamma"] is None or m["beta"] is None:
            return m.fail("LayerNorm has no affine weight and bias to absorb the scales")
        if not m.all_constant("gamma", "beta", "w"):
            return m.fail("LayerNorm affine parameters or Linear weight are not constants")
        return m.ok()

    def rewrite(self, m: Match, act_absmax: torch.Tensor) -> None:
        """Rewrite the match in place with scales from ``act_absmax`` (per LN channel)."""
        weight = m.value("w")
        s = smoothing_scales(act_absmax, weight, self.alpha)
        gamma, beta = m.value("gamma"), m.value("beta")
        new_gamma = (gamma.double() / s).to(gamma.dtype)
        new_beta = (beta.double() / s).to(beta.dtype)
        new_w = (weight.double() * s.unsqueeze(0)).to(weight.dtype)
        nodes = {"gamma": new_gamma, "beta": new_beta, "w": new_w}
        for name, value in nodes.items():
            const = m.constant(value, f"smooth_{name}")
            user = m["ln"] if name != "w" else m["linear"]
            user.prepend(const)  # defined before its user
            user.replace_input_with(m[name], const)

    # -- the same migration on fused modules: FusedLayerNorm -> FusedLinear / FusedQKVProjection
    def module_sites(self, gm: fx.GraphModule) -> list[tuple[fx.Node, list[fx.Node], str]]:
        """``(layernorm node, consumer nodes, reason)``; an empty reason means it may be smoothed.

        A LayerNorm feeding several GEMMs (q, k, v) is smoothed with one scale for all of them,
        from the largest weight column over the consumers.
        """
        modules = dict(gm.named_modules())
        found = []
        for node in gm.graph.nodes:
            if node.op != "call_module" or not isinstance(modules.get(node.target), FusedLayerNorm):
                continue
            ln = modules[node.target]
            users = list(node.users)
            gemms = (FusedLinear, FusedQKVProjection)
            reason = ""
            if ln.weight is None or ln.bias is None:
                reason = "LayerNorm has no affine weight and bias to absorb the scales"
            elif not users or not all(
                u.op == "call_module" and isinstance(modules.get(u.target), gemms) for u in users
            ):
                reason = "LayerNorm output feeds something other than Linear layers"
            found.append((node, users, reason))
        return found

    def rewrite_module_site(
        self, gm: fx.GraphModule, ln_node: fx.Node, users: list[fx.Node], act_absmax: torch.Tensor
    ) -> None:
        """Scale the LayerNorm's affine parameters down and its consumers' weights up."""
        weights = torch.cat([gm.get_submodule(u.target).weight.detach() for u in users])
        s = smoothing_scales(act_absmax, weights, self.alpha)
        ln = gm.get_submodule(ln_node.target)
        with torch.no_grad():
            ln.weight.copy_((ln.weight.double() / s).to(ln.weight.dtype))
            ln.bias.copy_((ln.bias.double() / s).to(ln.bias.dtype))
            for u in users:
                w = gm.get_submodule(u.target).weight
                w.copy_((w.double() * s.unsqueeze(0)).to(w.dtype))


class ChannelAbsMax(nn.Module):
    """Identity that records ``max |x|`` per channel of the last dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.absmax: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0)
        self.absmax = current if self.absmax is None else torch.maximum(self.absmax, current)
        return x


def apply_smoothing(gm: fx.GraphModule, rules: Sequence[SmoothingRule], data: Any) -> list[str]:
    """Smooth ``gm`` in place with ``rules``; ``data`` as for calibration.

    Collects the per-channel ``max |y|`` of each observed value over the calibration data (one
    extra pass, only when a rule matches), then lets each rule rewrite its match.

    Returns:
        The ids of the rewritten matches.
    """
    matches = []
    module_matches = []
    for rule in rules:
        matches += [m for m in find_matches(rule, gm) if not verdict(m)]
        for node, users, reason in rule.module_sites(gm):
            if not reason:
                module_matches.append((rule, node, users))
    if not matches and not module_matches:
        return []
    observed = copy.deepcopy(gm)
    nodes = {n.name: n for n in observed.graph.nodes}
    recorders: dict[str, ChannelAbsMax] = {}
    names = [m.pattern.observed(m).name for m in matches] + [n.name for _, n, _ in module_matches]
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
        m.pattern.rewrite(m, recorders[m.pattern.observed(m).name].absmax)
        done.append(m.id)
    for rule, node, users in module_matches:
        rule.rewrite_module_site(gm, node, users, recorders[node.name].absmax)
        done.append(f"{rule.name}@{module_path(node) or node.name}")
    gm.graph.eliminate_dead_code(keeps_side_effects)
    gm.graph.lint()
    gm.recompile()
    return done
