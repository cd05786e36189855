"""What the ``embedl_*`` dynamo backends did with each subgraph, reachable by the user.

Every subgraph Dynamo hands a backend gets a :class:`SubgraphReport`: which Backend and runtime
ran it, its transformation plan (``print(report.plan)`` lists every match, applied or skipped,
and why), whether the artifact came from the cache, and why it stayed in PyTorch if it did.

* :func:`last_report` returns the subgraphs compiled since the last :func:`clear_reports`
  (or :func:`explain`), oldest first;
* :func:`explain` compiles a model on example inputs with a fresh record and returns its report.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedl_dynamo.report_html import write_html

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


@dataclass
class CompileReport:
    """The subgraph reports of one record, oldest first."""

    subgraphs: list[SubgraphReport] = field(default_factory=list)

    def __str__(self) -> str:
        return self.summary()

    def summary(self, max_subgraphs: int = 8) -> str:
        """The first screen (a dozen lines): where each subgraph ran, the rewrites applied by
        kind, the precision mix and the compile time; the full plan is one call away."""
        if not self.subgraphs:
            return "no subgraph compiled by an embedl_* backend yet"
        subs = self.subgraphs
        compiled = [s for s in subs if s.status == "compiled" and s.runtime != "eager"]
        runtimes = sorted({s.runtime for s in compiled})
        lines = [
            f"embedl_dynamo: {len(subs)} subgraph{'s' if len(subs) != 1 else ''}, "
            f"{len(compiled)} compiled ({', '.join(runtimes) or 'none'}), "
            f"{len(subs) - len(compiled)} in PyTorch; "
            f"compile {sum(s.compile_s for s in subs):.1f} s"
        ]
        lines += [f"  {s}" for s in subs[:max_subgraphs]]
        if len(subs) > max_subgraphs:
            lines.append(f"  ... {len(subs) - max_subgraphs} more (report.subgraphs)")
        kinds: dict[str, int] = {}
        for s in subs:
            for name, count in s.pipeline.get("applied_by_pattern", {}).items():
                kinds[name] = kinds.get(name, 0) + count
        if kinds:
            ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{name} x{count}" for name, count in ranked[:6])
            more = f", +{len(ranked) - 6} kinds" if len(ranked) > 6 else ""
            lines.append(f"rewrites: {shown}{more}")
        lines.append(f"precision: {self.precision_mix()}")
        lines.append("full plan: print(report[i].plan)")
        return "\n".join(lines)

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as one self-contained HTML page (see :mod:`.report_html`)."""
        return write_html(self, path)

    def precision_mix(self) -> str:
        """``fp32``, or the precision asked for and how many layers run at each precision.

        Counts come from the per-layer records (``fp16``/``bf16``/``mixed``) or, for ``int8``,
        from the quantization report.
        """
        counts: dict[str, int] = {}
        asked = {s.pipeline.get("precision", "fp32") for s in self.subgraphs if s.pipeline}
        for sub in self.subgraphs:
            layers = sub.pipeline.get("layers") or []
            quant = sub.pipeline.get("quantization") or {}
            if not layers and sub.pipeline.get("quantized"):
                layers = [{"precision": "int8"}] * len(quant.get("quantized_layers", [])) + [
                    {"precision": "fp32"}
                ] * len(quant.get("float_layers", []))
            for layer in layers:
                counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
        asked.discard("fp32")
        if not asked and not counts:
            return "fp32"
        mode = "/".join(sorted(asked)) or "fp32"
        shown = ", ".join(f"{n} {p}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"{mode} ({shown} layers)" if shown else mode

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
