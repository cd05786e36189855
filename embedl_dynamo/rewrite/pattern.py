"""Declarative graph rewrites: :class:`Pattern`, the :class:`Match` it sees and its verdict.

A pattern is four pieces of data and code, in the style of PT2E's pattern functions and the
onnxscript rewriter's rules::

    class ConvBN(Pattern):
        '''Fold eval-mode BatchNorm into the conv: w' = w*g/std, b' = (b-mean)*g/std + beta.'''
        name = "conv_bn"
        phase = "fusion"
        id_node = "conv"  # plan ids name the conv: conv_bn@layer1.0.conv1
        qdq = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})

        @staticmethod
        def target(x, w, b, mean, var, gamma, beta):
            conv = F.conv2d(x, w, b)
            bn = F.batch_norm(conv, mean, var, gamma, beta)
            return bn, {"conv": conv, "bn": bn}

        def check(self, m):
            if m.kwarg("bn", "training"):
                return m.fail("BatchNorm is in training mode (call model.eval())")
            if not m.all_constant("w", "b", "mean", "var", "gamma", "beta"):
                return m.fail("convolution weights or BatchNorm statistics are not constants")
            return m.ok()

        def replace(self, m):
            w, b = fold_batch_norm(
                *(m.value(n) for n in ("w", "b", "mean", "var", "gamma", "beta")),
                m.kwarg("bn", "eps"),
            )
            c = m["conv"].kwargs  # canonical keywords
            fused = FusedConv(w, b, c["stride"], c["padding"], c["dilation"], c["groups"])
            return m.call_module(fused, m["x"])

:class:`~embedl_dynamo.patterns.fused_modules.FusedConv` and
:func:`~embedl_dynamo.patterns.fused_modules.fold_batch_norm` are the pattern library's; the
docs/architecture/patterns.md has the example with its imports (run by the docs tests).

``target`` is traced once and canonicalised like every graph, so any spelling of the same op
matches. Literal arguments in ``target`` (strides, ``training=False``) are wildcards: ``check``
says which values are acceptable, and *why* it declines (the reason shows up in the plan).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import fx

from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.matcher import CompiledPattern, compile_target
from embedl_dynamo.rewrite.qdq import QDQ

__all__ = ["PHASES", "MatchRule", "Pattern"]

PHASES = ("conversion", "fusion", "smooth", "quantized")


class MatchRule:
    """Something that finds a subgraph and judges each occurrence: ``target`` and ``check``.

    :class:`Pattern` (conversions, fusions) adds a replacement; the quantization stage's
    placement and smoothing rules (:mod:`embedl_dynamo.quant.int8.rules`) add annotations instead.

    Attributes:
        name: short snake_case identifier, unique within a Backend's list.
        phase: one of ``conversion``, ``fusion``, ``smooth``, ``quantized``.
        id_node: the match name whose module path names the match (default: the anchor).
    """

    name: ClassVar[str] = ""
    phase: ClassVar[str] = ""
    id_node: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.phase and cls.phase not in PHASES:
            raise ValueError(f"{cls.__name__}.phase must be one of {PHASES}, got {cls.phase!r}")

    @staticmethod
    def target(*args: Any) -> tuple[Any, dict[str, Any]]:
        """The subgraph to find, as a function: returns ``(output, {name: node, ...})``."""
        raise NotImplementedError

    def check(self, m: Match) -> MatchResult:
        """Whether the match qualifies; a failure carries the reason."""
        return m.ok()

    def compiled(self) -> CompiledPattern:
        """The traced, canonicalised target graph (built once per ``target`` function)."""
        return compile_target(self.target)

    @property
    def size(self) -> int:
        """Number of operations in the target: longer patterns are matched first."""
        return self.compiled().size

    def parameters(self) -> dict[str, Any]:
        """What distinguishes this instance from others of its class (a variant's arguments)."""
        return {k: v for k, v in vars(self).items() if k not in ("name", "target")}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase}

    def __repr__(self) -> str:
        args = [f"{k}={getattr(v, '__name__', v)!r}" for k, v in self.parameters().items()]
        if "name" in vars(self):
            args.insert(0, repr(self.name))
        return f"{type(self).__name__}({', '.join(args)})"

    def __eq__(self, other: object) -> bool:
        return (
            type(self) is type(other)
            and self.name == other.name  # type: ignore[attr-defined]
            and self.parameters() == other.parameters()  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((type(self), self.name))


class Pattern(MatchRule):
    """A rewrite rule (phase ``conversion`` or ``fusion``): ``target``, ``check``, ``replace``.

    Attributes:
        qdq: where QDQ goes around the replacement (data for the quantization stage).

    Example:
        ```python
        class ConvBN(Pattern):
            name, phase, id_node = "conv_bn", "fusion", "conv"
            ...  # target, check, replace: docs/architecture/patterns.md
        result = embedl_dynamo.transform(model.eval(), (x,), [ConvBN()])
        ```
    """

    qdq: ClassVar[QDQ] = QDQ()

    def replace(self, m: Match) -> fx.Node:
        """Build the replacement before ``m.anchor`` and return the node that replaces it."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "qdq": self.qdq.to_dict()}
