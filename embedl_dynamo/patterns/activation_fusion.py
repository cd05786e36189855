"""The shared body of the ``op [-> activation]`` fusions: :class:`ActivationFusion`.

A convolution, a convolution with its BatchNorm and a linear layer fuse with the activation
after them the same way: the match qualifies when the op does and the activation is one a fused
module can run, and the replacement is one fused module called on ``x`` whose ``activation``
names the matched one (``gelu_tanh`` for tanh GELU). :class:`ActivationFusion` owns that
``check`` and ``replace``, as onnxscript's ``_FuseBatchNormBase`` owns the one ``rewrite`` of its
Conv / ConvTranspose / Gemm rules; a subclass gives only what differs: its target, the op's own
conditions and the fused module it builds (:mod:`~embedl_dynamo.patterns.conv`,
:mod:`~embedl_dynamo.patterns.conv_bn`, :mod:`~embedl_dynamo.patterns.linear`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from embedl_dynamo.patterns.fused_modules import activation_name
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.qdq import FusedModule

__all__ = ["ActivationFusion", "check_activation"]


def check_activation(m: Match, name: str = "act") -> MatchResult:
    """The activation node ``name`` must be one a fused module can run."""
    if activation_name(m[name]) is None:
        approximate = m[name].kwargs.get("approximate")
        return m.fail(
            f"activation {m[name].target.__name__}(approximate={approximate!r}) is "
            "not supported by the fused kernel"
        )
    return m.ok()


class ActivationFusion(Pattern):
    """An op [-> activation] becomes one fused module with ``activation=...``.

    A variant is an instance, one per activation, so plan ids name the kernel and a glob toggles
    one kind. A subclass sets ``id_node`` and ``qdq`` and gives:

    * ``make_target(activation)``: the target ``activation(op(x, ...))``, or the bare op for
      None, with the activation's node named ``act``;
    * ``check_op(m)``: the op's own conditions, with the reason when they fail;
    * ``fused_module(m, activation)``: the module that replaces the match, called on ``m["x"]``.

    Args:
        name: the pattern name (plan ids ``<name>@<module path>``).
        activation: the canonical activation function, or None for the op alone.
    """

    phase = "fusion"

    def __init__(self, name: str, activation: Callable[..., torch.Tensor] | None) -> None:
        self.name = name
        self.activation = activation
        self.target = self.make_target(activation)

    @staticmethod
    def make_target(activation: Callable[..., torch.Tensor] | None) -> Callable[..., Any]:
        """The target function for ``activation`` (None: the op alone)."""
        raise NotImplementedError

    @staticmethod
    def check_op(m: Match) -> MatchResult:
        """Whether the op itself can be fused; a failure carries the reason."""
        raise NotImplementedError

    def fused_module(self, m: Match, activation: str | None) -> FusedModule:
        """The module replacing the match; ``activation`` is its fused-module name or None."""
        raise NotImplementedError

    def check(self, m: Match) -> MatchResult:
        result = self.check_op(m)
        if not result or self.activation is None:
            return result
        return check_activation(m)

    def replace(self, m: Match):
        activation = activation_name(m["act"]) if self.activation is not None else None
        return m.call_module(self.fused_module(m, activation), m["x"])
