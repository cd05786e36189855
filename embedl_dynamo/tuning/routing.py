"""Which runtime and which target's placement a lower precision takes on the runtime chosen.

``precision_route``: under ``auto``, a precision one runtime's kernels lead (the weight-only
ones: :func:`~embedl_dynamo.tuning.runtime_rules.precision_rule`) is built on that runtime.
``int8_route``: Torch-TensorRT's INT8 needs ModelOpt's quantize op, else ONNX -> TensorRT.
``cpu_precision_route``: on a CPU runtime, the ``tensorrt`` target's INT8 takes the placement of
that runtime's own target, whose integer kernels it forms.
"""

from __future__ import annotations

import logging

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.tensorrt import BACKEND as TENSORRT
from embedl_dynamo.precision import Precision
from embedl_dynamo.quant.int8.torch_tensorrt_qdq import has_quantize_op
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.runtime_rules import precision_rule

__all__ = ["cpu_precision_route", "int8_route", "precision_route"]

logger = logging.getLogger(__name__)


def precision_route(
    candidates: list[type[Runtime]], precision: Precision
) -> tuple[list[type[Runtime]], str]:
    """``candidates`` (best first) with the leader of ``precision``'s rule moved first, and a
    note for the report ("" when no rule applies: one candidate, a forced runtime, or the
    leader not installed or already first)."""
    rule = precision_rule(precision.name, [c.name for c in candidates])
    if rule is None:
        return candidates, ""
    leader = next(c for c in candidates if c.name == rule.leader)
    note = f"auto: {leader.name} for {precision.name} by the precision rule ({rule.evidence})"
    logger.info("%s", note)
    return [leader, *(c for c in candidates if c is not leader)], note


def int8_route(cls: type[Runtime], precision: Precision) -> tuple[type[Runtime], str]:
    """The runtime that carries INT8 for ``cls``, and a note for the report ("" if ``cls``).

    Torch-TensorRT's only INT8 op, ``tensorrt::quantize_op``, is registered by NVIDIA ModelOpt.
    Without it, INT8 (and ``mixed``) graphs go the ONNX -> TensorRT way (explicit Q/DQ in the
    file) when TensorRT is usable here; otherwise Torch-TensorRT builds and the INT8 request
    ends in its clear error and the float artifact. FP8 always goes the ONNX way: Torch-TensorRT
    2.13 converts FP8 ``quantize_op`` per tensor only, FP8 weights are per channel.
    """
    if cls is not TorchTensorRTRuntime or not precision.quantizes:
        return cls, ""
    int8 = precision.qdq_type == "int8"
    if (int8 and has_quantize_op()) or not TensorRTRuntime.is_available():
        return cls, ""
    note = (
        "INT8 through ONNX -> TensorRT: Torch-TensorRT's tensorrt::quantize_op needs NVIDIA "
        "ModelOpt (pip install nvidia-modelopt)"
        if int8
        else f"{precision.name.upper()} through ONNX -> TensorRT: Torch-TensorRT's quantize "
        "converter takes FP8 per tensor only, and the weights are per channel"
    )
    logger.info("%s", note)
    return TensorRTRuntime, note


def cpu_precision_route(
    cls: type[Runtime], backend: Backend, settings: Settings
) -> tuple[Backend, str]:
    """The placement the ``tensorrt`` target's INT8 takes on the CPU runtime ``cls``, and a note.

    TensorRT's Q/DQ (symmetric, on layer inputs, depthwise convs float) is what TensorRT runs as
    INT8, but not what a CPU runtime runs fastest: ONNX Runtime fuses only its own placement
    (Q/DQ around each layer, uint8 activations) and runs TensorRT's convs in float between
    Q/DQ; OpenVINO runs NNCF's placement (depthwise and squeeze-excite included) as integer
    kernels. So on a CPU runtime the graph gets the placement of the target the runtime declares
    (:attr:`~embedl_dynamo.runtimes.base.Runtime.cpu_target`). Float, other targets and GPU
    runtimes are unchanged.

    Returns:
        The backend whose placement builds the graph, and a report note ("" if unchanged).
    """
    target = cls.cpu_target
    int8_placed = settings.precision.qdq_type == "int8"  # not fp8's
    if backend != TENSORRT or not int8_placed or target is None:
        return backend, ""
    note = (
        f"INT8 placed for {cls.name}'s integer kernels (the {target.name} target's Q/DQ; no "
        "TensorRT here)"
    )
    logger.info("%s", note)
    return target, note
