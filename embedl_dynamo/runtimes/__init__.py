"""Runtimes: where a transformed graph runs (ONNX Runtime, OpenVINO, TensorRT, Torch-TensorRT, eager).

All follow one lifecycle (:class:`~.base.Runtime`) and declare their own facts; the registry
(:mod:`.registry`) is the one list of them (third parties add theirs through the
``embedl_dynamo.runtimes`` entry-point group or :func:`~.registry.register_runtime`) and
:func:`~.registry.runtime_candidates` picks the classes the settings ask for, ``auto`` the best
available. Adding a runtime is one folder plus one registry line.
"""

from __future__ import annotations

from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.registry import (
    register_runtime,
    runtime_candidates,
    runtime_classes,
    runtime_for_file,
)

__all__ = [
    "Runtime",
    "register_runtime",
    "runtime_candidates",
    "runtime_classes",
    "runtime_for_file",
]
