"""The quantization stage's rule protocols (phase ``quantized``): placement and preparation.

* :class:`PlacementRule` *annotates*: it says where Quantize/DequantizeLinear pairs go around a
  kind of op, and when that op stays in float (the reason lands in the quantization report). It
  matches canonical functions through ``target`` and/or fused modules by type; a rule without a
  ``target`` matches modules only (no dummy target).
* :class:`PreparationRewrite` rewrites a fused module's call into a form the target's INT8
  kernels need before annotation (torchao's ``transform_for_annotation``); the math is unchanged.

A Backend lists both in ``quantized_patterns``; its :class:`~.quantizer.Quantizer` runs the
rewrites, then the placement rules.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import fx, nn

from embedl_dynamo.rewrite.pattern import MatchRule
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = ["PlacementRule", "PreparationRewrite"]


class PlacementRule(MatchRule):
    """Where QDQ goes for one kind of op, and when it stays in float.

    Attributes:
        qdq: match names quantized on the way in (``inputs``), constant weights quantized per
            channel (``weights``) and the output role (``output``), for function matches.
        module_types: fused module types this rule decides for (their own ``qdq`` names their
            inputs and weights, :meth:`module_qdq` may narrow it); empty for function-only
            rules.
        module_output: quantize a matched module's output too (ONNX Runtime's placement).
    """

    phase: ClassVar[str] = "quantized"
    qdq: QDQ = QDQ()
    module_types: tuple[type[nn.Module], ...] = ()
    module_output: Role | None = None
    target: Any = None  # a rule without a target function decides for fused modules only

    @property
    def matches_functions(self) -> bool:
        """Whether the rule has a ``target`` to match canonical function calls."""
        return self.target is not None

    def check_module(self, module: FusedModule, node: fx.Node) -> str:
        """Why a fused module matched by type stays in float, or ``""`` to quantize it."""
        return ""

    def module_qdq(self, module: FusedModule, node: fx.Node) -> QDQ:
        """The QDQ positions of one fused module call (the module's own ``qdq`` unless a rule
        quantizes fewer of its inputs for its target)."""
        return module.qdq

    def qdq_for(self, m: Any) -> QDQ:
        """The QDQ positions of one function match (``qdq`` unless a rule decides per match)."""
        return self.qdq

    def refine(self, activations: dict[str, Role], gm: fx.GraphModule) -> list[str]:
        """After every rule has annotated ``gm``: drop activation points this rule makes
        redundant (none by default). Returns the names of the nodes dropped."""
        return []

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "qdq": self.qdq.to_dict()}


class PreparationRewrite:
    """A rewrite of fused module calls before annotation (phase ``quantized``).

    Subclasses set ``name`` and implement :meth:`rewrite_module`.
    """

    name: ClassVar[str] = ""
    phase: ClassVar[str] = "quantized"

    def rewrite_module(self, gm: fx.GraphModule, node: fx.Node, module: nn.Module) -> bool:
        """Rewrite the call ``node`` of ``module`` in ``gm`` in place; True if it did."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))
