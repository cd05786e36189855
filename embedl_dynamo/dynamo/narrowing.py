"""A runtime that fails on part of a graph, narrowed to the ops that make it fail.

A graph the conformance table gives a runtime may still fail there: the exporter stops at a
form of an op the table's samples did not hold, the runtime refuses the export, or the first
call's outputs differ from PyTorch's. Rather than run the whole graph in PyTorch, the failing
region is bisected: its compute nodes, in graph order, are split in halves, each half is built
on the runtime alone and judged on what it receives from the example inputs, and a failing
half is split again, down to single ops. The ops found stay in PyTorch, with the runtime's
error as the reason, and the graph is partitioned again around them (the caller's part).

A run of consecutive nodes of a fragment is a graph of its own: the partitioner's fragments
are convex, so a path between two nodes of the run passes only through nodes between them.
Probes build into a scratch cache that is removed after, at most :data:`MAX_PROBES` of them. A
failure no half reproduces on its own (one that only the pipeline's rewrites of the whole
cause) finds nothing: the region then runs in PyTorch, as it did before this module.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.files import wait_for_cache_writes
from embedl_dynamo.errors import error_line
from embedl_dynamo.partition import fragment_inputs, fragment_of, picks_output
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact

__all__ = ["MAX_PROBES", "failing_nodes"]

logger = logging.getLogger(__name__)

MAX_PROBES = 32  # builds of parts of one region, at most


@dataclasses.dataclass
class _Prober:
    """Builds parts of ``graph`` on one runtime, on what they receive from ``inputs``."""

    graph: fx.GraphModule
    runtime_cls: type[Runtime]
    settings: Settings
    inputs: Sequence[Any]
    probes: int = 0
    errors: dict[fx.Node, str] = dataclasses.field(default_factory=dict)

    def fails(self, nodes: list[fx.Node]) -> bool:
        """Whether ``nodes`` (and the picks of their outputs), built alone, fail; each single
        node that fails keeps its error."""
        self.probes += 1
        members = set(nodes)
        members.update(u for n in nodes for u in n.users if picks_output(u))
        ordered = [n for n in self.graph.graph.nodes if n in members]
        fragment = fragment_of(self.graph, self.runtime_cls.name, ordered)
        if not fragment.inputs:
            return False  # constants only: computed once, in PyTorch
        (received,) = fragment_inputs(self.graph, [fragment], [self.inputs])[0]
        try:
            runtime = self.runtime_cls(self.settings, None)
            runtime.build(fragment.graph, list(received), judge_artifact).deactivate()
        except Exception as exc:  # what the runtime or its judge raised: this part fails
            if len(nodes) == 1:
                self.errors[nodes[0]] = error_line(exc)
            logger.debug("narrowing: %d ops fail on %s: %s", len(nodes), fragment.runtime, exc)
            return True
        return False

    def bisect(self, nodes: list[fx.Node]) -> list[fx.Node]:
        """The nodes of a failing run that fail: each failing half narrowed again; the run
        itself where neither half fails alone, or the probes ran out."""
        if len(nodes) == 1:
            return nodes
        middle = len(nodes) // 2
        found: list[fx.Node] = []
        for half in (nodes[:middle], nodes[middle:]):
            if self.probes >= MAX_PROBES:
                return nodes
            if self.fails(half):
                found.extend(self.bisect(half))
        return found or nodes


def failing_nodes(
    graph: fx.GraphModule,
    nodes: list[fx.Node],
    runtime_cls: type[Runtime],
    settings: Settings,
    inputs: Sequence[Any],
) -> dict[fx.Node, str] | None:
    """The nodes among ``nodes`` (compute nodes of ``graph`` that failed together on the
    runtime, in graph order) that fail on it alone, each with why; None when no half of them
    fails alone, so nothing narrower than the whole is known.

    Args:
        graph: the frozen, functional graph.
        nodes: the failing region's compute nodes, a convex run of ``graph``'s.
        runtime_cls: the runtime that failed.
        settings: the build's settings (a scratch cache replaces its cache).
        inputs: the example inputs of ``graph``.
    """
    if len(nodes) < 2:
        return None
    with tempfile.TemporaryDirectory(prefix="embedl_narrowing_") as scratch:
        probe_settings = dataclasses.replace(settings, cache_dir=Path(scratch))
        prober = _Prober(graph, runtime_cls, probe_settings, inputs)
        with torch.no_grad():
            found = prober.bisect(nodes)
        wait_for_cache_writes()  # what the runtimes derive is written in the background
    if len(found) == len(nodes):
        return None
    reason = f"{runtime_cls.name} failed on it"
    return {n: f"{reason}: {prober.errors[n]}" if n in prober.errors else reason for n in found}
