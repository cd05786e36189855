"""What an export may write for its runtime, read from the conformance table, and the guards
``load()`` applies to the file.

``torch.compile`` partitions: an op a CPU runtime computes otherwise than PyTorch stays in
PyTorch and the rest of the graph runs on the runtime (:mod:`embedl_dynamo.partition`).
:func:`~embedl_dynamo.export` writes one file, which cannot hand an op back to PyTorch, so on
the frozen, functional graph it captured (the graph ``torch.compile`` partitions, before any
rewrite), :func:`check_export_graph` decides once, from the same table
(:mod:`embedl_dynamo.runtimes.conformance`):

* an op the table keeps in PyTorch on the file's runtime (no row for it and its input dtype,
  a ``kept`` rule, a listed difference on finite values, a float64 value on OpenVINO) is an
  :class:`~embedl_dynamo.errors.ExportError` naming the op, the runtime, the reason and the
  other CPU runtime where the table says it is exact (``backend='onnxruntime'``), for the
  ``onnxruntime`` and ``openvino`` targets (the ``tensorrt`` target keeps its lint);
* an op with a listed difference on NaN or infinities is written, and the sidecar records, per
  CPU runtime, why a call with such inputs is refused there (:attr:`ExportGuards.non_finite`,
  read by :mod:`~embedl_dynamo.deploy.non_finite`), as the compiled path's per-call guard does;
* a graph whose index ops PyTorch would refuse on some values gets the flag output of
  :func:`~embedl_dynamo.graph.index_guards.guard_indices`, named
  :data:`~embedl_dynamo.deploy.index_flag.INDEX_FLAG_OUTPUT` in the file
  (:mod:`~embedl_dynamo.deploy.index_flag`): ``load()`` raises ``IndexError`` when it is set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT
from embedl_dynamo.errors import ExportError
from embedl_dynamo.graph.capture import DYNAMIC_AXES_META
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.index_guards import guard_indices
from embedl_dynamo.graph.nodes import module_path, node_value_meta
from embedl_dynamo.runtimes.conformance import (
    CPU_RUNTIMES,
    NON_FINITE_EDGES,
    differences,
    needs_finite_inputs,
    node_blocker,
    op_name,
    rule_for,
)
from embedl_dynamo.runtimes.registry import runtime_classes

logger = logging.getLogger(__name__)

__all__ = [
    "JUDGED_TARGETS",
    "ExportGuards",
    "check_export_graph",
    "export_blockers",
    "non_finite_reasons",
    "refuse_kept_ops",
    "unproven_ops",
]

#: targets whose file is judged by the table (the tensorrt target keeps its lint)
JUDGED_TARGETS = ("onnxruntime", "openvino")
_RUNTIME_NAMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}


@dataclass(frozen=True)
class ExportGuards:
    """The graph an export runs its pipeline on, and the guards its file needs.

    Attributes:
        graph: the captured graph, with the index flag as its last output where
            :attr:`index_ops` is not empty.
        index_ops: the index ops the flag guards (``embedding@emb``); empty: no flag.
        non_finite: CPU runtime -> why it answers NaN or infinite inputs otherwise than
            PyTorch for this graph (None: it answers them as PyTorch does).
    """

    graph: fx.GraphModule
    index_ops: tuple[str, ...] = ()
    non_finite: Mapping[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The sidecar's ``guards``."""
        flag = {"output": INDEX_FLAG_OUTPUT, "ops": list(self.index_ops)}
        return {
            "index_out_of_range": flag if self.index_ops else None,
            "non_finite_inputs": dict(self.non_finite),
        }


def _where(node: fx.Node) -> str:
    """The op and where it is: ``cumsum@encoder.positions``, or its node outside modules."""
    path = module_path(node)
    return f"{op_name(node)}@{path}" if path else f"{op_name(node)} (node {node.name})"


def _blocker(node: fx.Node, runtime: str) -> str | None:
    """Why ``runtime`` does not compute ``node`` as PyTorch does (the one verdict of
    :func:`~embedl_dynamo.runtimes.conformance.node_blocker`, in export's words)."""
    reason = node_blocker(node, runtime)
    return reason.removesuffix("; runs in PyTorch") if reason is not None else None


def _unproven(node: fx.Node, runtime: str) -> bool:
    """Whether no row of the table speaks for ``node``'s op and input dtype on ``runtime``: not
    known to differ, only not checked (a file that exported before the table existed keeps
    exporting, with a warning)."""
    op = op_name(node)
    if op is None:
        return False
    source = next((a for a in node.all_input_nodes if hasattr(node_value_meta(a), "dtype")), None)
    dtype = getattr(node_value_meta(source), "dtype", None) if source is not None else None
    return rule_for(op, runtime, dtype) is None


def export_blockers(gm: fx.GraphModule, runtime: str) -> list[tuple[fx.Node, str]]:
    """Each node of ``gm`` that ``runtime`` is known to compute otherwise than PyTorch, and why
    (the table's words); empty for a runtime the table does not speak for. Ops without a row
    are not refused (:func:`unproven_ops` names them)."""
    if runtime not in CPU_RUNTIMES:
        return []
    found = ((node, _blocker(node, runtime)) for node in gm.graph.nodes)
    return [(n, why) for n, why in found if why is not None and not _unproven(n, runtime)]


def unproven_ops(gm: fx.GraphModule, runtime: str) -> list[str]:
    """The ops of ``gm`` no row of the table speaks for on ``runtime`` (where they are)."""
    if runtime not in CPU_RUNTIMES:
        return []
    nodes = (n for n in gm.graph.nodes if n.users and _unproven(n, runtime))
    return sorted({_where(n) for n in nodes})


def _target_of(runtime: str) -> str:
    cls = runtime_classes().get(runtime)
    target = getattr(cls, "cpu_target", None)
    return target.name if target is not None else runtime


def _alternative(gm: fx.GraphModule, node: fx.Node, runtime: str) -> str:
    """Where ``node`` is exact instead: the other CPU runtimes the table says compute it."""
    for other in CPU_RUNTIMES:
        if other == runtime or _blocker(node, other) is not None:
            continue
        whole = not export_blockers(gm, other)
        scope = "with every op of this model" if whole else "though other ops may not be"
        return f"{other} computes it exactly ({scope}): export with backend={_target_of(other)!r}"
    return (
        "no CPU runtime computes it as PyTorch does: torch.compile keeps it in PyTorch and runs "
        "the rest on the runtime; for export, write it in another form"
    )


def refuse_kept_ops(gm: fx.GraphModule, runtime: str) -> None:
    """Raise :class:`~embedl_dynamo.errors.ExportError` when ``runtime`` does not compute an
    op of ``gm`` as PyTorch does: the first such op and why, the others by name, and where it
    is exact."""
    unproven = unproven_ops(gm, runtime)
    if unproven:
        logger.warning(
            "export: %s have no conformance row for %s: the file holds them, unchecked on edge "
            "values (NaN, infinities, integer extremes)",
            ", ".join(unproven),
            runtime,
        )
    blockers = export_blockers(gm, runtime)
    if not blockers:
        return
    node, reason = blockers[0]
    others = sorted({_where(n) for n, _ in blockers[1:]} - {_where(node)})
    more = f" (also: {', '.join(others)})" if others else ""
    raise ExportError(
        f"{_where(node)}: {reason}{more}; an exported file cannot keep an op in PyTorch. "
        f"{_alternative(gm, node, runtime)}{_static_advice(blockers)}"
    )


def _static_advice(blockers: list[tuple[fx.Node, str]]) -> str:
    """Where every refused op computes a size from a dynamic axis (``9 * batch``), a file of
    static sizes holds each as a constant: say so."""
    if not all(isinstance(node_value_meta(n), torch.SymInt) for n, _ in blockers):
        return ""
    return (
        "; or export static sizes (dynamic_batch=False, --static-batch, and no dynamic_shapes): "
        "these ops compute sizes from a dynamic axis, which such a file holds as constants"
    )


def non_finite_reasons(gm: fx.GraphModule) -> dict[str, str | None]:
    """Per CPU runtime, why it answers NaN or infinite inputs of ``gm`` otherwise than PyTorch
    (the ops with a listed difference on them, and the first one's reason); None: it does
    not."""
    reasons: dict[str, str | None] = {}
    for runtime in CPU_RUNTIMES:
        nodes = [n for n in gm.graph.nodes if n.users and needs_finite_inputs(n, runtime)]
        if not nodes:
            reasons[runtime] = None
            continue
        ops = ", ".join(dict.fromkeys(str(op_name(n)) for n in nodes))
        first = next(
            d.reason
            for d in differences(str(op_name(nodes[0])), runtime)
            if d.edge in NON_FINITE_EDGES
        )
        name = _RUNTIME_NAMES.get(runtime, runtime)
        reasons[runtime] = f"{name} computes {ops} otherwise than PyTorch on them ({first})"
    return reasons


def check_export_graph(gm: fx.GraphModule, target: str, runtime: str) -> ExportGuards:
    """Judge the captured graph for an export to ``target`` whose file runs on ``runtime``.

    Args:
        gm: the frozen, functional graph :func:`~embedl_dynamo.graph.capture.capture` gave;
            not changed.
        target: the export's target name (``onnxruntime``, ``openvino``, ``tensorrt``).
        runtime: the runtime the file is meant to run on.

    Returns:
        The graph to run the pipeline on (with the index flag where one is needed) and the
        guards the sidecar records.

    Raises:
        ExportError: for the ``onnxruntime`` and ``openvino`` targets, an op ``runtime`` does
            not compute as PyTorch does (see :func:`refuse_kept_ops`).
    """
    if target in JUDGED_TARGETS:
        refuse_kept_ops(gm, runtime)
    non_finite = non_finite_reasons(gm)
    guard = guard_indices(gm)
    if guard is None:
        return ExportGuards(gm, (), non_finite)
    axes = guard.graph.meta.get(DYNAMIC_AXES_META)
    if isinstance(axes, DynamicAxes):  # the declared axes: the flag has none of its own
        guard.graph.meta[DYNAMIC_AXES_META] = DynamicAxes(axes.inputs, (*axes.outputs, {}))
    return ExportGuards(guard.graph, guard.ops, non_finite)
