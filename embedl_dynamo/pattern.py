"""Declarative graph rewrites: :class:`Pattern`, the :class:`Match` it sees and its verdict.

A pattern is four pieces of data and code, in the style of PT2E's pattern functions and the
onnxscript rewriter's rules::

    class ConvBN(Pattern):
        '''Fold eval-mode BatchNorm into the convolution: w' = w*g/std, b' = (b-mean)*g/std + beta.'''
        name = "conv_bn"
        phase = "fusion"
        qdq = QDQ(inputs={"x": Role.ACTIVATION})

        @staticmethod
        def target(x, w, b, mean, var, gamma, beta):
            conv = F.conv2d(x, w, b)
            bn = F.batch_norm(conv, mean, var, gamma, beta)
            return bn, {"conv": conv, "bn": bn}

        def check(self, m):
            if not m.all_constant("w", "mean", "var"):
                return m.fail("BatchNorm statistics are not constants")
            return m.ok()

        def replace(self, m):
            return m.call_module(FusedConvBN.from_match(m), m["x"])

``target`` is traced once and canonicalised like every graph, so any spelling of the same op
matches. Literal arguments in ``target`` (strides, ``training=False``) are wildcards: ``check``
says which values are acceptable, and *why* it declines (the reason shows up in the plan).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import fx, nn

from .graph_utils import PATH_KEY, constant_value, module_path, node_shape

__all__ = [
    "PHASES",
    "QDQ",
    "FusedModule",
    "Match",
    "MatchResult",
    "Pattern",
    "Role",
]

PHASES = ("conversion", "fusion", "smooth", "quantized")


class Role(str, enum.Enum):
    """What a quantized position holds; the target's quantization config maps it to a spec."""

    ACTIVATION = "activation"
    WEIGHT = "weight"
    BIAS = "bias"
    OUTPUT = "output"


@dataclass(frozen=True)
class QDQ:
    """Where a pattern (or fused module) wants Quantize/DequantizeLinear pairs: data, not code.

    Attributes:
        inputs: match names (pattern arguments) whose values are quantized on the way in.
        weights: match names of constant weights quantized per channel inside the fused op.
        output: the role of the pattern's output when it is quantized on the way out, or None.
    """

    inputs: Mapping[str, Role] = field(default_factory=dict)
    weights: Mapping[str, Role] = field(default_factory=dict)
    output: Role | None = None

    def __post_init__(self) -> None:
        for mapping in (self.inputs, self.weights):
            for name, role in mapping.items():
                if not isinstance(role, Role):
                    raise TypeError(f"QDQ position {name!r} needs a Role, got {role!r}")
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "weights", dict(self.weights))

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": {k: v.value for k, v in self.inputs.items()},
            "weights": {k: v.value for k, v in self.weights.items()},
            "output": self.output.value if self.output else None,
        }

    @property
    def empty(self) -> bool:
        return not self.inputs and not self.weights and self.output is None


@dataclass(frozen=True)
class MatchResult:
    """The verdict of :meth:`Pattern.check`: ``ok``, or not with the reason why."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Match:
    """One occurrence of a pattern in a graph, with names for its nodes and inputs.

    ``m["conv"]`` is the graph node the pattern called ``conv``; ``m["x"]`` what its argument
    ``x`` is bound to (a node, or a literal such as ``None`` for a missing bias).
    """

    def __init__(
        self,
        pattern: Pattern,
        gm: fx.GraphModule,
        anchor: fx.Node,
        bindings: dict[str, Any],
        node_map: dict[fx.Node, fx.Node],
    ) -> None:
        self.pattern = pattern
        self.gm = gm
        self.anchor = anchor
        self._bindings = bindings
        self.node_map = node_map  # pattern node -> graph node (internal ops only)

    # -- lookup -------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        try:
            return self._bindings[name]
        except KeyError:
            raise KeyError(
                f"pattern {self.pattern.name!r} has no node or input named {name!r}; "
                f"known: {sorted(self._bindings)}"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self._bindings

    @property
    def names(self) -> list[str]:
        return list(self._bindings)

    @property
    def nodes(self) -> list[fx.Node]:
        """The graph nodes the pattern's operations matched, in graph order."""
        matched = set(self.node_map.values())
        return [n for n in self.gm.graph.nodes if n in matched]

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    @property
    def path(self) -> str:
        """Module path naming this match (of the pattern's ``id_node``), e.g. ``layer1.0.conv1``."""
        node = self._bindings.get(self.pattern.id_node, self.anchor)
        if not isinstance(node, fx.Node):
            node = self.anchor
        return module_path(node) or node.name

    @property
    def id(self) -> str:
        """Stable id ``<pattern>@<module path>`` used by plans and globs."""
        return f"{self.pattern.name}@{self.path}"

    def kwarg(self, name: str, arg: str) -> Any:
        """The (literal or node) argument ``arg`` of the matched node ``name``."""
        return self[name].kwargs[arg]

    def value(self, name: str) -> Any:
        """The constant tensor bound to ``name``, the literal itself, or None if not constant."""
        bound = self[name]
        if isinstance(bound, fx.Node):
            return constant_value(self.gm, bound)
        return bound

    def is_constant(self, name: str) -> bool:
        """Whether ``name`` is bound to a ``get_attr`` constant (or a literal such as None)."""
        bound = self[name]
        return not isinstance(bound, fx.Node) or bound.op == "get_attr"

    def all_constant(self, *names: str) -> bool:
        return all(self.is_constant(n) for n in names)

    def shape(self, name: str) -> tuple | None:
        return node_shape(self[name])

    # -- verdicts -----------------------------------------------------------------------------
    def ok(self) -> MatchResult:
        return MatchResult(True)

    def fail(self, reason: str) -> MatchResult:
        return MatchResult(False, reason)

    # -- building the replacement -------------------------------------------------------------
    def call_module(self, module: nn.Module, *args: Any, name: str | None = None) -> fx.Node:
        """Add ``module`` to the graph module and call it on ``args`` before the anchor."""
        base = re.sub(r"[^0-9a-zA-Z_]", "_", name or f"{self.pattern.name}_{self.path}") or "fused"
        qualname, index = base, 1
        while hasattr(self.gm, qualname):
            index += 1
            qualname = f"{base}_{index}"
        self.gm.add_module(qualname, module)
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_module(qualname, tuple(args))
        node.meta[PATH_KEY] = self.path
        return node

    def call(self, target: Callable[..., Any], **kwargs: Any) -> fx.Node:
        """Add a canonical ``call_function`` node before the anchor."""
        from .canonicalize import canonical_call

        with self.graph.inserting_before(self.anchor):
            return canonical_call(self.graph, target, path=self.path, **kwargs)

    def constant(self, tensor: torch.Tensor, name: str) -> fx.Node:
        """Register ``tensor`` as a buffer of the graph module and return a ``get_attr`` node."""
        base = re.sub(r"[^0-9a-zA-Z_]", "_", f"{self.path}_{name}").strip("_") or name
        attr, index = f"_const_{base}", 1
        while hasattr(self.gm, attr):
            index += 1
            attr = f"_const_{base}_{index}"
        self.gm.register_buffer(attr, tensor.detach().clone())
        with self.graph.inserting_before(self.anchor):
            node = self.graph.get_attr(attr)
        node.meta[PATH_KEY] = self.path
        node.meta["val"] = tensor
        return node


class Pattern:
    """Base class of all rewrites. Subclasses set ``name``, ``phase``, ``target`` and ``replace``.

    Attributes:
        name: short snake_case identifier, unique within a Backend.
        phase: one of ``conversion``, ``fusion``, ``smooth``, ``quantized``.
        qdq: where QDQ goes around the replacement (data for the quantization stage).
        id_node: the match name whose module path names the match (default: the anchor).
    """

    name: ClassVar[str] = ""
    phase: ClassVar[str] = ""
    qdq: ClassVar[QDQ] = QDQ()
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
        """Whether the rewrite is valid for this match; a failure carries the reason."""
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        """Build the replacement before ``m.anchor`` and return the node that replaces it."""
        raise NotImplementedError

    # -- matcher plumbing -----------------------------------------------------------------------
    def compiled(self):
        """The traced, canonicalised target graph (built once per pattern class)."""
        from .matcher import compile_pattern

        return compile_pattern(type(self))

    @property
    def size(self) -> int:
        """Number of operations in the target: longer patterns are matched first."""
        return self.compiled().size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "qdq": self.qdq.to_dict()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(type(self))


class FusedModule(nn.Module):
    """Base of the modules fusions put in the graph; declares where QDQ goes around it.

    ``qdq.inputs`` names forward arguments by position (``"0"``, ``"1"``), ``qdq.weights``
    names the module's own parameters (``"weight"``) quantized per output channel.
    """

    qdq: ClassVar[QDQ] = QDQ()

    def extra_repr(self) -> str:
        return ""


def iter_patterns(patterns: Iterable[Pattern], phase: str) -> list[Pattern]:
    """The patterns of ``phase`` from ``patterns``, in order."""
    return [p for p in patterns if p.phase == phase]
