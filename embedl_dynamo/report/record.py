"""The record of what the ``embedl_*`` dynamo backends compiled, reachable by the user.

Every subgraph Dynamo hands a backend gets a :class:`SubgraphReport`: which Backend and runtime
ran it, the rows of its transformation plan (``print(report.plan)`` lists every match, applied
or skipped, and why), whether the artifact came from the cache, and why it stayed in PyTorch if
it did. A report holds names and numbers only: it keeps no graph, module or weight alive.

* :func:`last_report` returns the subgraphs of the last ``torch.compile``'d callable that
  compiled (its first call through all its subgraphs, and its recompiles), oldest first;
* :func:`clear_reports` empties the record;
* :func:`explain` compiles a model on example inputs with a fresh record and returns its report.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

import torch
from torch import nn

from embedl_dynamo.report.compile_report import CompileReport
from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = ["clear_reports", "explain", "last_report", "next_index", "record"]

_MAX_KEPT = 256
_DYNAMO_ENTRY = ("compile_wrapper", os.path.join("_dynamo", "eval_frame.py"))

_lock = threading.Lock()
_record: list[SubgraphReport] = []
_compile: tuple[Any, int] | None = None  # whose compiles the record holds (see _compile_key)


def _compile_key() -> Any | None:
    """Which compiled callable the calling backend works for: the function that the outermost
    ``torch.compile``'d call on this thread's stack (Dynamo's ``compile_wrapper``) compiles.
    Every subgraph of its first call (graph breaks included) and of its recompiles on later
    calls (a new shape, a size made dynamic) shares it; another compiled callable has another.
    None when no such frame is on the stack (then the record goes on as it is)."""
    frame, outermost = sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if code.co_name == _DYNAMO_ENTRY[0] and code.co_filename.endswith(_DYNAMO_ENTRY[1]):
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return None
    return outermost.f_locals.get("fn", outermost)


def _held(key: Any) -> tuple[Any, int]:
    """``key`` held without keeping it alive: a weak reference where it takes one (so a later
    callable at the same address is another compile), and its ``id``."""
    try:
        return weakref.ref(key), id(key)
    except TypeError:
        return None, id(key)


def _is_current(key: Any) -> bool:
    if _compile is None:
        return False
    ref, identity = _compile
    return ref() is key if ref is not None else id(key) == identity


def next_index() -> int:
    """The index the next recorded subgraph gets: its order within its compile."""
    key = _compile_key()
    with _lock:
        return 0 if key is not None and not _is_current(key) else len(_record)


def record(report: SubgraphReport) -> None:
    """Append a subgraph report to the record of its compiled callable, which replaces the
    record of another one (keeps the newest :data:`_MAX_KEPT`). A fragment's report is part
    of its subgraph's (:attr:`SubgraphReport.partitions`), not recorded on its own."""
    global _compile
    if report.partition is not None:
        return
    key = _compile_key()
    with _lock:
        if key is not None and not _is_current(key):
            _record.clear()
            _compile = _held(key)
        if any(r is report for r in _record):
            return  # recorded already: a subgraph whose failed build is narrowed, built again
        _record.append(report)
        del _record[:-_MAX_KEPT]


def clear_reports() -> None:
    """Start a new record (and free the reports it held).

    Example:
        ```python
        embedl_dynamo.clear_reports()
        torch.compile(model, backend="embedl_onnxruntime")(x)
        print(embedl_dynamo.last_report())  # this compile only
        ```
    """
    global _compile
    with _lock:
        _record.clear()
        _compile = None


def last_report() -> CompileReport:
    """The subgraphs of the last ``torch.compile``'d callable that compiled: those of its first
    call (graph breaks included) and of its later calls that compiled again (a new shape, a
    size made dynamic). A compile of another callable starts a new report; so does
    [clear_reports][embedl_dynamo.clear_reports].

    Example:
        ```python
        torch.compile(model, backend="embedl_onnxruntime")(x)
        print(embedl_dynamo.last_report())  # each subgraph: runtime, precision, fusions
        ```
    """
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
        options: compile options (see `embedl_dynamo.settings.Settings`).

    Returns:
        The `CompileReport` of the subgraphs this call compiled.

    Example:
        ```python
        report = embedl_dynamo.explain(model, x, backend="embedl_onnxruntime")
        print(report)
        ```
    """
    clear_reports()
    compiled = torch.compile(model, backend=backend, options=options or None)
    with torch.no_grad():
        compiled(*inputs)
    return last_report()
