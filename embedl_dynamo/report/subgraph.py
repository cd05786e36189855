"""What an ``embedl_*`` dynamo backend did with one subgraph: :class:`SubgraphReport`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SubgraphReport"]


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
        runtime_info: the runtime's ``build_info``.
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

    def plan_later(self, factory: Callable[[], Any]) -> None:
        """Compute the plan with ``factory`` on first access (a warm start skipped planning)."""
        self._plan, self._plan_factory = None, factory

    def __str__(self) -> str:
        applied = self.pipeline.get("applied_count", 0)
        line = (
            f"subgraph {self.index}: {self.status} on {self.runtime} (backend {self.backend}, "
            f"{self.ops} ops, {applied} rewrites{', cached' if self.cached else ''}, "
            f"{self.compile_s:.2f} s)"
        )
        return f"{line}: {self.reason}" if self.reason else line
