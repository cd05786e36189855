"""A warm start: a subgraph compiled before loads its artifact without running the pipeline.

A float subgraph is keyed *before* transformation (:func:`source_key`: its graph, weights,
inputs, the target's patterns, the settings and this package's code); after its first compile
an alias maps that key to the ONNX artifact and the runtime it ran on. The next compile of the
same subgraph, in any process, loads that artifact (:func:`warm_start`), checks it against the
frozen graph on the example inputs, and reports the plan rows stored with the alias.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.cache.keys import content_key, fingerprint_graph, library_versions
from embedl_dynamo.dynamo.subgraph_alias import forget_alias, lookup_alias
from embedl_dynamo.errors import CorruptEntryError, OutputMismatchError, error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import code_fingerprint, input_specs
from embedl_dynamo.report.plan_rows import PlanSnapshot
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact

__all__ = ["source_key", "warm_start"]

logger = logging.getLogger(__name__)


def source_key(
    frozen: fx.GraphModule,
    inputs: list[torch.Tensor],
    axes: DynamicAxes,
    backend: Backend,
    settings: Settings,
) -> str:
    """Key of a subgraph *before* transformation: graph, weights, inputs, patterns, code."""
    return content_key(
        "subgraph",
        fingerprint_graph(frozen),
        input_specs(inputs, axes),
        axes.to_json(),
        backend.to_dict(),
        settings.key_dict(),
        code_fingerprint(),
        library_versions(runtime_classes().values()),
    )


def warm_start(
    source_key: str,
    frozen: fx.GraphModule,
    inputs: list[torch.Tensor],
    axes: DynamicAxes,
    backend: Backend,
    settings: Settings,
    report: SubgraphReport,
    runtimes: Sequence[type[Runtime]],
) -> Callable[..., Any] | None:
    """With a warm cache, load the artifact this subgraph compiled to before, skipping the
    pipeline, on the runtime it ran on (one of ``runtimes``); ``report.plan`` gets the plan rows
    the alias stored (no graph is kept for it).

    The artifact is checked against the frozen (untransformed) graph on the example inputs.
    Returns None when there is nothing usable in the cache.
    """
    try:
        alias = lookup_alias(source_key, settings)
    except (OSError, ValueError) as exc:  # an unreadable cache must not stop the compile
        logger.warning("subgraph %d: warm cache unusable (%s); compiling", report.index, exc)
        return None
    if alias is None:
        return None
    by_name = {cls.name: cls for cls in runtimes}
    runtime_cls = by_name.get(str(alias.get("runtime", OnnxRuntime.name)))
    if runtime_cls is None:
        return None  # it ran on a runtime not wanted now
    runtime = runtime_cls(settings, axes)
    if not runtime.use_cached(alias["onnx_key"]):
        return None
    try:
        runtime.build(frozen, inputs, judge_artifact)
    except Exception as exc:
        # wrong answers are the entry's fault: said. A run that fails (a division by zero in
        # these inputs) fails the compile that follows too, which says it in its one line
        bad = isinstance(exc, (OutputMismatchError, CorruptEntryError))
        level = logging.WARNING if bad else logging.INFO
        logger.log(level, "cached artifact for subgraph %d unusable (%s); replacing it",
                   report.index, error_line(exc))  # fmt: skip
        forget_alias(source_key, alias["onnx_key"], settings)
        return None
    report.runtime, report.cached = runtime.name, True
    report.runtime_info = dict(runtime.build_info)
    report.pipeline = dict(alias.get("pipeline") or {})
    report.plan = PlanSnapshot.from_dicts(alias.get("plan") or [])  # rows, never the graph
    return runtime.serve()
