"""What the ``embedl_*`` dynamo backends did with each subgraph, reachable by the user.

Every subgraph Dynamo hands a backend gets a :class:`SubgraphReport`: which Backend and runtime
ran it, its transformation plan (``print(report.plan)`` lists every match, applied or skipped,
and why), whether the artifact came from the cache, and why it stayed in PyTorch if it did.

* :func:`last_report` returns the subgraphs compiled since the last :func:`clear_reports`
  (or :func:`explain`), oldest first;
* :func:`explain` compiles a model on example inputs with a fresh record and returns its report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["CompileReport", "SubgraphReport", "clear_reports", "explain", "last_report"]

_MAX_KEPT = 256


@dataclass
class SubgraphReport:
    """One compiled subgraph.

    Attributes:
        index: order of compilation in this record.
        backend: the embedl Backend (target) name.
        runtime: the runtime that runs it (``eager`` when it stayed in PyTorch).
        ops: number of operations in the Dynamo graph.
        status: ``compiled``, ``eager`` (fell back or too small) or ``training`` (not frozen).
        reason: why it runs eager, naming the op when known.
        cached: the artifact came from the cache (nothing built).
        plan: the :class:`~embedl_dynamo.rewrite.plan.TransformationPlan` (None when not transformed;
            planned on first access when a warm cache let compilation skip the pipeline).
        pipeline: the pipeline report (applied/skipped counts, timings).
        runtime_info: the runtime's ``to_dict()["build_info"]``.
        compile_s: seconds spent in the backend for this subgraph.
    """

    index: int
    backend: str
    runtime: str
    ops: int
    status: str
    reason: str = ""
    cached: bool = False
    pipeline: dict[str, Any] = field(default_factory=dict)
    runtime_info: dict[str, Any] = field(default_factory=dict)
    compile_s: float = 0.0
    _plan: Any = field(default=None, repr=False)
    _plan_factory: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def plan(self) -> Any:
        """The transformation plan; computed on first access when the artifact was cached."""
        if self._plan is None and self._plan_factory is not None:
            self._plan, self._plan_factory = self._plan_factory(), None
        return self._plan

    @plan.setter
    def plan(self, value: Any) -> None:
        self._plan = value

    def __str__(self) -> str:
        applied = self.pipeline.get("applied_count", 0)
        line = (
            f"subgraph {self.index}: {self.status} on {self.runtime} (backend {self.backend}, "
            f"{self.ops} ops, {applied} rewrites{', cached' if self.cached else ''}, "
            f"{self.compile_s:.2f} s)"
        )
        return f"{line}: {self.reason}" if self.reason else line


@dataclass
class CompileReport:
    """The subgraph reports of one record, oldest first."""

    subgraphs: list[SubgraphReport] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.subgraphs:
            return "no subgraph compiled by an embedl_* backend yet"
        return "\n".join(str(s) for s in self.subgraphs)

    def __len__(self) -> int:
        return len(self.subgraphs)

    def __iter__(self):
        return iter(self.subgraphs)

    def __getitem__(self, i: int) -> SubgraphReport:
        return self.subgraphs[i]


_lock = threading.Lock()
_record: list[SubgraphReport] = []


def next_index() -> int:
    """The index the next recorded subgraph gets."""
    with _lock:
        return len(_record)


def record(report: SubgraphReport) -> None:
    """Append a subgraph report (keeps the newest :data:`_MAX_KEPT`)."""
    with _lock:
        _record.append(report)
        del _record[:-_MAX_KEPT]


def clear_reports() -> None:
    """Start a new record."""
    with _lock:
        _record.clear()


def last_report() -> CompileReport:
    """The subgraphs compiled by ``embedl_*`` backends since the last :func:`clear_reports`."""
    with _lock:
        return CompileReport(list(_record))


def explain(
    model: nn.Module, *inputs: Any, backend: str = "embedl_tensorrt", **options: Any
) -> CompileReport:
    """Compile ``model`` with an embedl backend, run it once on ``inputs`` and report.

    Args:
        model: the model (not modified).
        inputs: example inputs for one call.
        backend: the dynamo backend name (``embedl_tensorrt``, ``embedl_onnxruntime``...).
        options: compile options (see :class:`~embedl_dynamo.settings.Settings`).

    Returns:
        The :class:`CompileReport` of the subgraphs this call compiled.
    """
    clear_reports()
    compiled = torch.compile(model, backend=backend, options=options or None)
    with torch.no_grad():
        compiled(*inputs)
    return last_report()
