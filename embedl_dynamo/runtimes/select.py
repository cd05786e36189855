"""Runtime selection: the forced runtime, or for ``auto`` the best one available here.

``auto`` takes the runtimes the target names (``Backend.runtimes``; every runtime in
:data:`~embedl_dynamo.settings.AUTO_ORDER` for a target that names none), drops those not
installed and, for a graph whose tensors are not on a CUDA device, the two TensorRT runtimes (a
CPU model stays on the CPU: copying every call's inputs to a GPU and back is not what a CPU
caller asked for). What remains are the candidates, best first. Where several CPU runtimes
remain (OpenVINO and ONNX Runtime for the ``tensorrt`` target on a machine without a GPU) a
float graph is timed on each and the faster one runs (:mod:`.runtime_choice`). A forced
runtime that cannot run raises :class:`~.base.RuntimeUnavailableError` naming what is missing.

On a CPU, the ``tensorrt`` target's INT8 takes the placement of the runtime that runs it
(:func:`cpu_precision_route`): TensorRT's Q/DQ (symmetric, on layer inputs, depthwise convs
float) is what neither CPU runtime turns into its fastest integer kernels.
"""

from __future__ import annotations

import logging
from pathlib import Path

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.quant.torch_tensorrt_qdq import has_quantize_op
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime import OnnxRuntime
from embedl_dynamo.runtimes.openvino import OpenVINORuntime
from embedl_dynamo.runtimes.tensorrt import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt import TorchTensorRTRuntime
from embedl_dynamo.settings import AUTO_ORDER, RUNTIMES, Settings

__all__ = [
    "AUTO_ORDER",
    "CPU_TARGETS",
    "CUDA_ONLY",
    "RUNTIME_CLASSES",
    "cpu_precision_route",
    "int8_route",
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


def int8_route(cls: type[Runtime], precision: str) -> tuple[type[Runtime], str]:
    """The runtime that carries INT8 for ``cls``, and a note for the report ("" if ``cls``).

    Torch-TensorRT's only INT8 op, ``tensorrt::quantize_op``, is registered by NVIDIA ModelOpt.
    Without it, INT8 (and ``mixed``) graphs go the ONNX -> TensorRT way (explicit Q/DQ in the
    file) when TensorRT is usable here; otherwise Torch-TensorRT builds and the INT8 request
    ends in its clear error and the float artifact.
    """
    if cls is not TorchTensorRTRuntime or precision not in ("int8", "mixed"):
        return cls, ""
    if has_quantize_op() or not TensorRTRuntime.is_available():
        return cls, ""
    note = (
        "INT8 through ONNX -> TensorRT: Torch-TensorRT's tensorrt::quantize_op needs NVIDIA "
        "ModelOpt (pip install nvidia-modelopt)"
    )
    logger.info("%s", note)
    return TensorRTRuntime, note


def cpu_precision_route(
    cls: type[Runtime], backend: Backend, settings: Settings
) -> tuple[Backend, str]:
    """The placement the ``tensorrt`` target's INT8 takes on the CPU runtime ``cls``, and a note.

    TensorRT's Q/DQ (symmetric, on layer inputs, depthwise convs float) is what TensorRT runs as
    INT8, but not what a CPU runtime runs fastest: ONNX Runtime fuses only its own placement
    (Q/DQ around each layer, uint8 activations) and ran TensorRT's convs in float between Q/DQ
    (ResNet-50: 1.02x eager, against 0.19x); OpenVINO runs NNCF's placement (depthwise and
    squeeze-excite included) as integer kernels. So on a CPU runtime the graph gets that
    runtime's own target's placement (``onnxruntime`` / ``openvino``). Float, other targets and
    GPU runtimes are unchanged.

    Returns:
        The backend whose placement builds the graph, and a report note ("" if unchanged).
    """
    target = CPU_TARGETS.get(cls)
    if backend.name != "tensorrt" or settings.precision not in ("int8", "mixed") or not target:
        return backend, ""
    note = (
        f"INT8 placed for {cls.name}'s integer kernels (the {target.name} target's Q/DQ; no "
        "TensorRT here)"
    )
    logger.info("%s", note)
    return target, note


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
