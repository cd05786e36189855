"""Runtime selection: the forced runtime, or for ``auto`` the best one available here.

``auto`` prefers TensorRT (explicit engine) > Torch-TensorRT > ONNX Runtime > eager and logs
its choice at INFO; the two TensorRT runtimes are candidates only for a graph whose tensors are
on a CUDA device (a CPU model stays on the CPU: copying every call's inputs to a GPU and back is
not what a CPU caller asked for). A forced runtime that cannot run raises
:class:`~.base.RuntimeUnavailableError` naming what is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.quant.torch_tensorrt_qdq import has_quantize_op
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime import OnnxRuntime
from embedl_dynamo.runtimes.openvino import OpenVINORuntime
from embedl_dynamo.runtimes.tensorrt import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt import TorchTensorRTRuntime
from embedl_dynamo.settings import RUNTIMES, Settings

__all__ = [
    "AUTO_ORDER",
    "CUDA_ONLY",
    "RUNTIME_CLASSES",
    "cpu_int8_route",
    "int8_route",
    "resolve_runtime",
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
AUTO_ORDER = ("tensorrt", "torch_tensorrt", "onnxruntime", "eager")
CUDA_ONLY = frozenset({"tensorrt", "torch_tensorrt"})
_logged_auto: set[str] = set()


def resolve_runtime(name: str, on_cuda: bool = False) -> type[Runtime]:
    """The runtime class for ``name`` (``auto`` resolved), checked to be available.

    Args:
        name: a runtime name or ``auto``.
        on_cuda: the graph's tensors are on a CUDA device (``auto`` may then pick TensorRT).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        RuntimeUnavailableError: a forced runtime cannot run here.
    """
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; valid runtimes: {', '.join(RUNTIMES)}")
    if name != "auto":
        cls = RUNTIME_CLASSES[name]
        cls.require()
        return cls
    for candidate in AUTO_ORDER:
        if candidate in CUDA_ONLY and not on_cuda:
            continue
        cls = RUNTIME_CLASSES[candidate]
        missing = cls.missing()
        if missing is None:
            if candidate not in _logged_auto:
                _logged_auto.add(candidate)
                logger.info("runtime 'auto' selected %s", candidate)
            return cls
        logger.debug("runtime %s skipped by 'auto': %s", candidate, missing)
    return EagerRuntime


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


def cpu_int8_route(
    cls: type[Runtime], backend: Backend, settings: Settings
) -> tuple[type[Runtime], Backend, str]:
    """Where the ``tensorrt`` target's INT8 runs on a CPU, with which placement, and a note.

    The target's Q/DQ (symmetric, on layer inputs) is what TensorRT and OpenVINO run as INT8,
    but ONNX Runtime's CPU kernels fuse only its own placement (Q/DQ around each layer, uint8
    activations); on ONNX Runtime the tensorrt placement runs the convs in float between Q/DQ
    (ResNet-50: 1.02x eager, against 0.19x). Measured on this CPU:

    * ``auto`` with OpenVINO installed: INT8 runs there, with the target's placement
      (ResNet-50 0.19x eager as on ONNX Runtime; BERT-base 0.34x against 0.47x; ViT-small
      0.43x against 0.60x; NNCF + OpenVINO: 0.19x, 0.30x, 0.41x);
    * on ONNX Runtime (forced, or OpenVINO absent): the ``onnxruntime`` target's placement.

    Float, other targets and GPUs are unchanged.

    Returns:
        The runtime class, the backend whose patterns build the graph, and a report note ("" if
        nothing changed).
    """
    if backend.name != "tensorrt" or settings.precision not in ("int8", "mixed"):
        return cls, backend, ""
    if (
        cls is OnnxRuntime
        and settings.runtime == "auto"
        and settings.precision == "int8"
        and OpenVINORuntime.missing() is None
    ):
        note = "INT8 on OpenVINO: it runs the tensorrt target's Q/DQ as integer kernels"
        logger.info("%s", note)
        return OpenVINORuntime, backend, note
    if cls is OnnxRuntime:
        note = (
            "INT8 placed for ONNX Runtime's integer kernels (the onnxruntime target's Q/DQ; "
            "ONNX Runtime runs the tensorrt target's as float convs)"
        )
        logger.info("%s", note)
        return cls, ONNXRUNTIME, note
    return cls, backend, ""


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
