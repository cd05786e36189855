"""One occurrence of a pattern in a graph (:class:`Match`) and a check's verdict (:class:`MatchResult`).

A leaf of the rewrite layer: the matcher builds matches, patterns read them. What a match needs
of the rule that found it is the :class:`Rule` protocol (:class:`~.pattern.MatchRule` is one), so
this module imports nothing from the rest of the layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import fx, nn

from embedl_dynamo.graph.nodes import (
    PATH_KEY,
    canonical_call,
    constant_value,
    module_path,
    node_shape,
)

__all__ = ["Match", "MatchResult", "Rule"]


@dataclass(frozen=True)
class MatchResult:
    """The verdict of a rule's ``check``: ``ok``, or not with the reason why.

    Example:
        ```python
        def check(self, m: Match) -> MatchResult:
            return m.ok() if m.all_constant("w") else m.fail("the weight is not a constant")
        ```
    """

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Rule(Protocol):
    """What a :class:`Match` and its verdict need of the rule that found it."""

    @property
    def name(self) -> str:
        """The rule's name; a match's id is ``name@module.path``."""
        ...

    @property
    def id_node(self) -> str:
        """The match name whose module path names the match (``""``: the anchor)."""
        ...

    def check(self, m: Match) -> MatchResult:
        """Whether the match qualifies; a failure carries the reason."""
        ...


class Match:
    """One occurrence of a pattern in a graph, with names for its nodes and inputs.

    ``m["conv"]`` is the graph node the pattern called ``conv``; ``m["x"]`` what its argument
    ``x`` is bound to (a node, or a literal such as ``None`` for a missing bias).

    Example:
        ```python
        def check(self, m: Match) -> MatchResult:
            if m.kwarg("bn", "training"):
                return m.fail("BatchNorm is in training mode (call model.eval())")
            return m.ok()
        ```
    """

    def __init__(
        self,
        pattern: Rule,
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
