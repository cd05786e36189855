"""Outputs that are views of another output or of an input, regenerated after the call.

Hugging Face's DINOv2 returns ``sequence_output`` and its slice ``pooled_output``; ``return
x.t(), x * 2`` returns a view of an input. In eager they share memory with that tensor, so a
write into one shows in the other; a runtime returns copies. As AOTAutograd does, such an
output is not taken from the runtime: the caller replays its view ops (:data:`REPLAYABLE_VIEWS`)
on the runtime's output it views, or on the caller's own input, after the call
(:class:`OutputView`). Where several outputs view one tensor the graph does not return (CvT's
``cls_token, hidden = torch.split(x, ...)``), that tensor becomes an extra output, as
AOTAutograd's intermediate bases do (:func:`with_view_bases`): the views are regenerated from
it and the caller drops it. An alias that is not such a view (a view reading sizes from the
graph, a view through ``as_strided``) keeps the graph in PyTorch
(:func:`~embedl_dynamo.graph.functionalize.output_alias`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of
from embedl_dynamo.graph.view_writes import REPLAYABLE_VIEWS, view_position

__all__ = ["REPLAYABLE_VIEWS", "OutputView", "ViewBases", "output_views", "with_view_bases"]


@dataclass(frozen=True)
class OutputView:
    """Output ``position`` is ``replay(base)``: ``base`` is output ``index`` (``of_input``
    False) or the placeholder at ``index`` (True)."""

    index: int
    of_input: bool
    replay: fx.GraphModule

    def __call__(self, base: torch.Tensor) -> torch.Tensor:
        return self.replay(base)


def _standalone(ops: list[fx.Node]) -> bool:
    """Whether ``ops`` read nothing from the graph but the value they view (no sizes)."""
    for op in ops:
        found: list[fx.Node] = []
        fx.node.map_arg((op.args[1:], op.kwargs), found.append)
        if found:
            return False
    return True


def _replayer(ops: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    value = graph.placeholder("base")
    for op in ops:
        first = op.args[0]
        value = graph.node_copy(op, lambda a, v=value, f=first: v if a is f else a)
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph)


def output_views(
    gm: fx.GraphModule, analysis: GraphAnalysis | None = None
) -> dict[int, OutputView]:
    """The outputs of ``gm`` the caller regenerates as views, by output position (see the
    module): each shares storage with a returned tensor or an input, is that tensor's view
    through replayable ops reading no sizes from the graph, and that tensor is returned as
    itself (not regenerated) or is a placeholder. ``analysis`` is ``gm``'s, where the caller
    has it."""
    analysis = analysis_of(gm, analysis)
    values = analysis.outputs
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bases = {}  # a tensor returned as itself -> its first output position
    for position, value in enumerate(values):
        if isinstance(value, fx.Node) and not view_position(value, analysis)[1]:
            bases.setdefault(analysis.roots[value], position)
    found = {}
    for position, value in enumerate(values):
        if not isinstance(value, fx.Node) or value not in analysis.classes:
            continue
        base, ops = view_position(value, analysis)
        if not ops or not _standalone(ops):
            continue
        if base in bases:
            found[position] = OutputView(bases[base], False, _replayer(ops))
        elif base.op == "placeholder":
            found[position] = OutputView(placeholders.index(base), True, _replayer(ops))
    return found


@dataclass(frozen=True)
class ViewBases:
    """A copy of a graph that also returns the tensors several of its outputs view
    (:func:`with_view_bases`); the caller keeps the first ``outputs`` of what it returns."""

    gm: fx.GraphModule
    outputs: int

    def visible(self, returned: Any) -> Any:
        """``returned`` (the copy's outputs, in its container) without the bases."""
        return type(returned)(returned[: self.outputs])


def _view_bases(gm: fx.GraphModule, analysis: GraphAnalysis | None = None) -> list[fx.Node]:
    """The tensors of ``gm``, neither inputs nor returned as themselves, that two or more of
    its outputs are views of through replayable ops reading no sizes from the graph, in order
    of first use: :func:`with_view_bases` returns them too. ``analysis`` is ``gm``'s, where
    the caller has it."""
    analysis = analysis_of(gm, analysis)
    viewers: dict[fx.Node, int] = {}
    returned = set()
    for value in analysis.outputs:
        if not isinstance(value, fx.Node) or value not in analysis.classes:
            continue
        base, ops = view_position(value, analysis)
        if not ops:
            returned.add(base)
        elif _standalone(ops) and base.op != "placeholder":
            viewers[base] = viewers.get(base, 0) + 1
    return [base for base, count in viewers.items() if count > 1 and base not in returned]


def with_view_bases(gm: fx.GraphModule, analysis: GraphAnalysis | None = None) -> ViewBases | None:
    """A copy of ``gm`` that returns, after its own outputs, each tensor two or more of them
    view without the graph returning it (see the module), or None where there is none;
    ``analysis`` is ``gm``'s, where the caller has it. ``gm`` is not modified.

    Example:
        >>> import torch
        >>> def f(x):
        ...     first, rest = torch.split(x * 2, [1, 3])
        ...     return first, rest
        >>> bases = with_view_bases(fx.symbolic_trace(f))
        >>> bases.outputs, len(bases.gm(torch.ones(4)))
        (2, 3)
    """
    analysis = analysis_of(gm, analysis)
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    shared = _view_bases(gm, analysis)
    if not shared or not isinstance(returned, (tuple, list)):
        return None
    graph = fx.Graph()
    value_map: dict[fx.Node, fx.Node] = {}
    copied = graph.graph_copy(gm.graph, value_map)
    graph.output(type(returned)([*copied, *(value_map[b] for b in shared)]))
    return ViewBases(fx.GraphModule(gm, graph), len(returned))
