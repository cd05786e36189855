"""What an ``embedl_*`` dynamo backend did with one subgraph: :class:`SubgraphReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embedl_dynamo.report.plan_rows import PlanSnapshot

__all__ = ["LOWER_REJECTED", "SubgraphReport"]

#: the pipeline report's entry set when a lower precision's artifact was rejected and the float
#: artifact runs instead (kept with the pipeline report, so a warm start reads it too)
LOWER_REJECTED = "lower_rejected"


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
        loaded: set on a warm start, where the subgraph ran no pipeline stage and loaded what
            an earlier build stored: ``"loaded"``, or ``"loaded (decided on <cpu> ...)"`` when
            that build's decisions were made on another CPU or with other runtime versions;
            empty when this process built it.
        plan: the plan's rows, a graph-free :class:`~.plan_rows.PlanSnapshot` (``print`` shows
            the plan table; None when not transformed). Setting it to a
            :class:`~embedl_dynamo.rewrite.plan.TransformationPlan` keeps only its rows, so a
            report never keeps a graph or its weights alive.
        pipeline: the pipeline report (applied/skipped counts, timings).
        runtime_info: the runtime's ``build_info``.
        compile_s: seconds spent in the backend for this subgraph.
        partition: for a fragment of a partitioned subgraph, its number among the fragments
            (None: a Dynamo subgraph).
        partitions: for a partitioned subgraph (status ``partitioned``), the report of each
            runtime fragment.
        kept: the nodes a partitioned subgraph keeps in PyTorch: ``{"node", "op", "reason"}``.
        coverage: the share of the subgraph's compute nodes and FLOPs on a runtime
            (``{"ops": ..., "ops_on_runtime": ..., "op_share": ...}``).
        calibrating: INT8 without calibration data that has not calibrated yet: its first
            calls run in PyTorch (the reason says how many).
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
    loaded: str = ""
    partition: int | None = None
    partitions: list[SubgraphReport] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    coverage: dict[str, Any] = field(default_factory=dict)
    calibrating: bool = False
    _plan: PlanSnapshot | None = field(default=None, repr=False)

    @property
    def lower_rejected(self) -> bool:
        """Whether the lower precision's artifact was rejected and the float one runs."""
        return bool(self.pipeline.get(LOWER_REJECTED, False))

    @property
    def plan(self) -> PlanSnapshot | None:
        """The plan's rows (:class:`~.plan_rows.PlanSnapshot`), or None."""
        return self._plan

    @plan.setter
    def plan(self, value: Any) -> None:
        self._plan = PlanSnapshot.of(value)

    def __str__(self) -> str:
        applied = self.pipeline.get("applied_count", 0)
        name = f"subgraph {self.index}"
        if self.partition is not None:
            name += f" fragment {self.partition}"
        line = (
            f"{name}: {self.status} on {self.runtime} (backend {self.backend}, "
            f"{self.ops} ops, {applied} rewrites{self._origin()}, "
            f"{self.compile_s:.2f} s)"
        )
        return f"{line}: {self.reason}" if self.reason else line

    def _origin(self) -> str:
        if self.loaded:
            return f", {self.loaded}"
        return ", cached" if self.cached else ""
