"""The runtime registry: every runtime by name, the forced one, or for ``auto`` the candidates.

``auto`` takes the runtimes the target names (``Backend.runtimes``; every runtime in
:data:`~embedl_dynamo.settings.AUTO_ORDER` for a target that names none), drops those not
installed and, for a graph whose tensors are not on a CUDA device, the two TensorRT runtimes (a
CPU model stays on the CPU: copying every call's inputs to a GPU and back is not what a CPU
caller asked for). What remains are the candidates, best first. Where several CPU runtimes
remain (OpenVINO and ONNX Runtime for the ``tensorrt`` target on a machine without a GPU) a
float graph is timed on each and the faster one runs (:mod:`embedl_dynamo.tuning.runtime_choice`). A
forced runtime that cannot run raises
:class:`~embedl_dynamo.errors.RuntimeUnavailableError` naming what is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime
from embedl_dynamo.settings import AUTO_ORDER, RUNTIMES

__all__ = [
    "AUTO_ORDER",
    "CPU_TARGETS",
    "CUDA_ONLY",
    "RUNTIME_CLASSES",
    "resolve_runtime",
    "runtime_candidates",
    "runtime_for_file",
]

logger = logging.getLogger(__name__)

RUNTIME_CLASSES: dict[str, type[Runtime]] = {
    "onnxruntime": OnnxRuntime,
    "openvino": OpenVINORuntime,
    "tensorrt": TensorRTRuntime,
    "torch_tensorrt": TorchTensorRTRuntime,
    "eager": EagerRuntime,
}
CUDA_ONLY = frozenset({"tensorrt", "torch_tensorrt"})
# the target whose INT8 placement each CPU runtime turns into integer kernels
CPU_TARGETS: dict[type[Runtime], Backend] = {OnnxRuntime: ONNXRUNTIME, OpenVINORuntime: OPENVINO}
_logged_auto: set[str] = set()


def _check_name(name: str) -> None:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; valid runtimes: {', '.join(RUNTIMES)}")


def runtime_candidates(
    name: str, backend: Backend | None = None, on_cuda: bool = False
) -> list[type[Runtime]]:
    """The runtimes that may run a graph, best first (see the module docstring).

    Args:
        name: a runtime name or ``auto``.
        backend: the target (its ``runtimes`` narrow ``auto``); None: every runtime.
        on_cuda: the graph's tensors are on a CUDA device.

    Returns:
        ``[the forced runtime]``, or for ``auto`` the available candidates (``[EagerRuntime]``
        when none of the target's runtimes is installed).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        RuntimeUnavailableError: a forced runtime cannot run here.
    """
    _check_name(name)
    if name != "auto":
        cls = RUNTIME_CLASSES[name]
        cls.require()
        return [cls]
    order = (backend.runtimes if backend is not None else ()) or AUTO_ORDER
    found = []
    for candidate in order:
        if candidate in CUDA_ONLY and not on_cuda:
            continue
        cls = RUNTIME_CLASSES[candidate]
        missing = cls.missing()
        if missing is None:
            found.append(cls)
        else:
            logger.debug("runtime %s skipped by 'auto': %s", candidate, missing)
    if not found:
        wanted = ", ".join(order)
        logger.warning(
            "runtime 'auto': none of %s is installed for target %r; the graph stays in PyTorch",
            wanted, backend.name if backend is not None else "",
        )  # fmt: skip
        return [EagerRuntime]
    key = ",".join(c.name for c in found)
    if key not in _logged_auto:
        _logged_auto.add(key)
        logger.info("runtime 'auto' selected %s", " or ".join(c.name for c in found))
    return found


def resolve_runtime(
    name: str, on_cuda: bool = False, backend: Backend | None = None
) -> type[Runtime]:
    """The runtime class for ``name`` (``auto``: the first candidate), checked to be available.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        RuntimeUnavailableError: a forced runtime cannot run here.
    """
    return runtime_candidates(name, backend, on_cuda)[0]


def runtime_for_file(path: Path) -> type[Runtime]:
    """The runtime class that loads an artifact with ``path``'s suffix.

    Raises:
        ValueError: no runtime takes that suffix (the message lists the known ones).
    """
    suffix = Path(path).suffix.lower()
    for cls in RUNTIME_CLASSES.values():
        if suffix in cls.artifact_suffixes:
            return cls
    known = [f"{s} ({cls.name})" for cls in RUNTIME_CLASSES.values() for s in cls.artifact_suffixes]
    raise ValueError(
        f"cannot load {Path(path).name}: expected .onnx or a TensorRT engine; known suffixes: "
        f"{', '.join(known)}"
    )
