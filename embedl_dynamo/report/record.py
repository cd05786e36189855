"""The record of what the ``embedl_*`` dynamo backends compiled, reachable by the user.

Every subgraph Dynamo hands a backend gets a :class:`SubgraphReport`: which Backend and runtime
ran it, the rows of its transformation plan (``print(report.plan)`` lists every match, applied
or skipped, and why), whether the artifact came from the cache, and why it stayed in PyTorch if
it did. A report holds names and numbers only: it keeps no graph, module or weight alive.

* :func:`last_report` returns the subgraphs compiled since the last :func:`clear_reports`
  (or :func:`explain`), oldest first;
* :func:`explain` compiles a model on example inputs with a fresh record and returns its report.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from embedl_dynamo.report.compile_report import CompileReport
from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = ["clear_reports", "explain", "last_report", "next_index", "record"]

_MAX_KEPT = 256

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
