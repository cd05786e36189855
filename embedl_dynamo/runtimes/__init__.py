"""Runtimes: where a transformed graph runs (ONNX Runtime, OpenVINO, TensorRT, Torch-TensorRT, eager).

All follow one lifecycle (:class:`~.base.Runtime`); :func:`~.registry.resolve_runtime` picks the
class the settings ask for, ``auto`` picking the best available.
"""

from __future__ import annotations

from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.registry import RUNTIME_CLASSES, resolve_runtime, runtime_for_file

__all__ = [
    "RUNTIME_CLASSES",
    "Runtime",
    "resolve_runtime",
    "runtime_for_file",
]
