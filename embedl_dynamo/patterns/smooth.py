"""SmoothQuant scale migration (phase ``smooth``): LayerNorm -> Linear.

Activations after a LayerNorm have a few outlier channels that ruin a per-tensor INT8 scale;
weights quantize per output channel and tolerate a larger range. Per input channel ``j`` of the
Linear, with ``a_j = max |y_j|`` over calibration data and ``w_j = max_i |W_ij|``::

    s_j = a_j ** alpha / w_j ** (1 - alpha)
    gamma' = gamma / s,   beta' = beta / s,   W'[:, j] = W[:, j] * s_j

so ``linear(layer_norm(x; gamma', beta'), W') == linear(layer_norm(x; gamma, beta), W)``
exactly in real arithmetic (float rounding only), while the activation range shrinks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.patterns.attention import FusedLayerNorm, FusedQKVProjection
from embedl_dynamo.patterns.fused_modules import FusedLinear
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["SmoothLayerNormLinear", "smoothing_scales"]


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s_j = a_j^alpha / w_j^(1-alpha)`` per input channel, clamped away from 0 and inf."""
    a = act_absmax.double().clamp(min=1e-5)
    w = weight.detach().double().abs().amax(dim=0).clamp(min=1e-5)
    return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp(min=1e-5, max=1e5)


class SmoothLayerNormLinear(Pattern):
    """Migrate activation outliers from a LayerNorm's output into the next Linear's weight.

    Args:
        alpha: migration strength in [0, 1]; 0.5 is SmoothQuant's default.
    """

    name = "smooth_layernorm_linear"
    phase = "smooth"
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
    def match_modules(self, gm: fx.GraphModule) -> list[tuple[fx.Node, list[fx.Node], str]]:
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

    def rewrite_modules(
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

    def __repr__(self) -> str:
        return f"SmoothLayerNormLinear(alpha={self.alpha})"
