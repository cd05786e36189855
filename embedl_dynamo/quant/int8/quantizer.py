"""A target's quantizer, in the shape of torchao's PT2E ``Quantizer``.

:meth:`Quantizer.transform_for_annotation` rewrites the fused graph into the form the target's
INT8 kernels need (SmoothQuant migrations, preparation rewrites); :meth:`Quantizer.annotate`
decides where Q/DQ goes (a :class:`~.placement.Placement`, nothing inserted yet); and
:meth:`Quantizer.validate` checks that the decision refers to what the graph holds. Each
Backend owns one (``Backend.quantizer``), built from its ``smooth_patterns``,
``quantized_patterns`` and ``quantization`` config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx

from embedl_dynamo.quant.int8.placement import Placement, apply_preparation, plan_placement
from embedl_dynamo.quant.int8.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.quant.int8.smooth import SmoothingRule, apply_smoothing
from embedl_dynamo.quant.int8.spec import QuantizationConfig

__all__ = ["Quantizer"]


@dataclass(frozen=True)
class Quantizer:
    """How one target quantizes a fused graph.

    Attributes:
        name: the target's name (reports).
        config: the QDQ specs per role.
        rules: placement rules and preparation rewrites, in priority order.
        smoothing: SmoothQuant rules run before placement.
    """

    name: str
    config: QuantizationConfig
    rules: Sequence[PlacementRule | PreparationRewrite] = ()
    smoothing: Sequence[SmoothingRule] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.config, QuantizationConfig):
            raise TypeError(
                f"config must be a QuantizationConfig, got {type(self.config).__name__}"
            )
        for rule in self.rules:
            if not isinstance(rule, (PlacementRule, PreparationRewrite)):
                raise TypeError(f"{rule!r} is not a PlacementRule or PreparationRewrite")
        for rule in self.smoothing:
            if not isinstance(rule, SmoothingRule):
                raise TypeError(f"{rule!r} is not a SmoothingRule")
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "smoothing", tuple(self.smoothing))

    def with_config(self, config: QuantizationConfig) -> Quantizer:
        """The same rules with another config (an observer override, a user's specs)."""
        return Quantizer(self.name, config, self.rules, self.smoothing)

    def transform_for_annotation(self, gm: fx.GraphModule, data: Any) -> dict[str, list[str]]:
        """Smooth (calibrating on ``data`` when a rule matches) and prepare ``gm`` in place.

        Returns:
            ``{"smoothed": ids, "rewritten": node names}``.
        """
        smoothed = apply_smoothing(gm, self.smoothing, data) if self.smoothing else []
        rewrites = [r for r in self.rules if isinstance(r, PreparationRewrite)]
        return {"smoothed": smoothed, "rewritten": apply_preparation(gm, rewrites)}

    def annotate(self, gm: fx.GraphModule) -> Placement:
        """Where Q/DQ goes in ``gm`` (not modified)."""
        return plan_placement(gm, [r for r in self.rules if isinstance(r, PlacementRule)])

    def validate(self, gm: fx.GraphModule, placement: Placement) -> None:
        """Raise ``ValueError`` if ``placement`` names a value or weight ``gm`` does not hold."""
        nodes = {n.name for n in gm.graph.nodes}
        missing = sorted(set(placement.activations) - nodes)
        if missing:
            raise ValueError(f"{self.name} quantizer: no graph value named {missing[:5]}")
        for point in placement.weights.values():
            owner = point.module or point.target.rpartition(".")[0]
            attr = point.param or point.target.rpartition(".")[2]
            try:
                holder = gm.get_submodule(owner) if owner else gm
            except AttributeError:
                holder = None
            if holder is None or not hasattr(holder, attr):
                raise ValueError(f"{self.name} quantizer: no weight {point.key!r} in the graph")
