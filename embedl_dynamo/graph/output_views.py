"""Outputs that are views of another output or of an input, regenerated after the call.

Hugging Face's DINOv2 returns ``sequence_output`` and its slice ``pooled_output``; ``return
x.t(), x * 2`` returns a view of an input. In eager they share memory with that tensor, so a
write into one shows in the other; a runtime returns copies. As AOTAutograd does, such an
output is not taken from the runtime: the caller replays its view ops (:data:`REPLAYABLE_VIEWS`)
on the runtime's output it views, or on the caller's own input, after the call
(:class:`OutputView`). An alias that is not such a view (two views of a tensor that is not
returned, a view through ``as_strided``) keeps the graph in PyTorch
(:func:`~embedl_dynamo.graph.functionalize.output_alias`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of
from embedl_dynamo.graph.view_writes import REPLAYABLE_VIEWS, view_position

__all__ = ["REPLAYABLE_VIEWS", "OutputView", "output_views"]


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
