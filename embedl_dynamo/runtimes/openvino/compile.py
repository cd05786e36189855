"""Compiling an ONNX file with OpenVINO's CPU plugin, in the precision the file asks for.

:func:`compile_openvino` is the one place this package compiles OpenVINO models: it reads the
file, lowers what OpenVINO's ONNX frontend would leave unfused (:mod:`.lowering`) and sets
``INFERENCE_PRECISION_HINT`` from the file (:func:`inference_precision`): ``f32`` for a float
file (never silently lower: on CPUs with bf16 the plugin's own default would compute in bf16),
the half type for a file that carries it (a typed ``bf16``/``fp16`` graph) or whose unquantized
layers were chosen to run in it (:mod:`~embedl_dynamo.graph.rest_precision`), where the CPU
computes in that type.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.errors import error_line
from embedl_dynamo.graph.rest_precision import ONNX_REST_PRECISION
from embedl_dynamo.runtimes.openvino.lowering import lower_for_openvino

__all__ = [
    "compile_openvino",
    "computes_in",
    "cpu_capabilities",
    "half_hint",
    "inference_precision",
    "openvino_cause",
]

logger = logging.getLogger(__name__)

# OpenVINO's half element type -> the CPU plugin's OPTIMIZATION_CAPABILITIES entry computing it
_HALF_CAPABILITY = {"bf16": "BF16", "f16": "FP16"}
_HALF_TYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}
_REST_TYPE = {"bf16": "bf16", "fp16": "f16"}  # a rest precision -> OpenVINO's element type


def openvino_cause(exc: BaseException) -> str:
    """The line of an OpenVINO error that says what is wrong (its first lines only name the
    C++ source files the exception passed through, ``Exception from src/...cpp:117:``, and
    the condition that failed, ``Check 'x == y' failed at src/...cpp:669:``)."""
    return error_line(exc, with_type=False, skip=("Exception from ", "Check '"))


def compile_openvino(
    path: Path,
    num_threads: int | None = None,
    config: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    hint: str | None = None,
    shapes: Sequence[Sequence[int]] | None = None,
    device: str = "CPU",
) -> Any:
    """An ``openvino.CompiledModel`` of the ONNX file ``path`` on ``device`` (by default the
    CPU, where this package's OpenVINO decisions are made): the one place this
    package compiles them (lowered by :mod:`.openvino_lowering`, in the precision
    :func:`inference_precision` reads from the file).

    Args:
        path: the ``.onnx`` file.
        num_threads: inference threads (OpenVINO's default when None).
        config: more CPU plugin properties (``{"PERF_COUNT": True}`` for profiling).
        info: a dict that gets ``openvino_lowering`` (what was rewritten),
            ``inference_precision`` and, where the file's half type is not computed here,
            ``half_precision_note``, when given.
        hint: compile with this ``INFERENCE_PRECISION_HINT`` (``bf16``/``f16``, see
            :func:`half_hint`) instead of the one the file's types ask for.
        shapes: compile for exactly these input shapes (the CPU plugin then picks its kernels
            and memory plan once); the file's dynamic axes when None.
        device: the OpenVINO device (``CPU``; ``GPU`` where OpenVINO has one).

    Raises:
        RuntimeError: OpenVINO cannot compile it, or ``hint`` is a type this CPU does not
            compute in; the message names the cause.
    """
    import openvino as ov

    core = ov.Core()
    capabilities = core.get_property(device, "OPTIMIZATION_CAPABILITIES")
    if hint is not None and _HALF_CAPABILITY.get(hint, hint.upper()) not in capabilities:
        raise RuntimeError(
            f"this CPU does not compute in {hint} (OpenVINO's OPTIMIZATION_CAPABILITIES: "
            f"{', '.join(capabilities)}): its {hint} hint would run f32; use the typed graph "
            "or precision='fp32'"
        )
    try:
        model = core.read_model(str(path))
        if shapes is not None and len(shapes) == len(model.inputs):
            model.reshape({port: list(shape) for port, shape in zip(model.inputs, shapes)})
            if info is not None:
                info["static_shapes"] = [list(shape) for shape in shapes]
        precision = hint or inference_precision(model, capabilities)
        note = _half_not_computed(model, capabilities, precision)
        properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, **(config or {})}
        if num_threads is not None and device == "CPU":  # a CPU plugin property
            properties["INFERENCE_NUM_THREADS"] = num_threads
        lowered = lower_for_openvino(model)
        if info is not None:
            info["inference_precision"] = precision
            if note:
                info["half_precision_note"] = note
            if lowered:
                info["openvino_lowering"] = lowered
        return core.compile_model(model, device, properties)
    except RuntimeError as exc:
        raise RuntimeError(
            f"OpenVINO cannot compile {Path(path).name}: {openvino_cause(exc)}"
        ) from exc


@functools.cache
def cpu_capabilities() -> tuple[str, ...]:
    """The CPU plugin's ``OPTIMIZATION_CAPABILITIES`` (``BF16``, ``FP16``, ``INT8``...)."""
    import openvino as ov

    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def computes_in(hint: str) -> bool:
    """Whether this CPU computes in OpenVINO's half type ``hint`` (``bf16``/``f16``)."""
    return _HALF_CAPABILITY.get(hint, hint.upper()) in cpu_capabilities()


def inference_precision(model: Any, capabilities: Sequence[str]) -> str:
    """OpenVINO's ``INFERENCE_PRECISION_HINT`` for ``model`` on a CPU with ``capabilities``
    (the plugin's ``OPTIMIZATION_CAPABILITIES``).

    ``bf16``/``f16`` where the model carries that type (our ``bf16``/``fp16`` precision casts
    its matmul-class layers) and the CPU computes in it (``BF16``: AVX512_BF16 or AMX;
    ``FP16``: AVX512_FP16 or AMX-FP16); else ``f32``. A float model is never computed in a
    lower precision than it asked for, which the plugin's own default would do on bf16 CPUs.
    """
    carried = _carried_types(model) | _rest_types(model)
    for half, capability in _HALF_CAPABILITY.items():
        if half in carried and capability in capabilities:
            return half
    return "f32"


def _carried_types(model: Any) -> set[str]:
    return {
        op.get_output_element_type(i).get_type_name()
        for op in model.get_ordered_ops()
        for i in range(op.get_output_size())
    }


def _rest_types(model: Any) -> set[str]:
    """The OpenVINO half type the file's metadata asks its unquantized layers to run in."""
    path = ["framework", ONNX_REST_PRECISION]
    if not model.has_rt_info(path):
        return set()
    name = model.get_rt_info(path).astype(str)
    return {_REST_TYPE[name]} if name in _REST_TYPE else set()


def _half_not_computed(model: Any, capabilities: Sequence[str], precision: str) -> str:
    """A warning (logged, and returned for ``build_info``) where ``model`` carries a half type
    this CPU does not compute in, so it runs in ``f32``; "" otherwise."""
    if precision != "f32":
        return ""
    missing = [h for h, c in _HALF_CAPABILITY.items() if c not in capabilities]
    carried = [h for h in missing if h in _carried_types(model) | _rest_types(model)]
    if not carried:
        return ""
    note = (
        f"this CPU does not compute in {carried[0]} (OpenVINO's OPTIMIZATION_CAPABILITIES has "
        f"no {_HALF_CAPABILITY[carried[0]]}): the {carried[0]} graph runs in f32, with its "
        f"{carried[0]} weights"
    )
    logger.warning("%s", note)
    return note


def half_hint(dtype: torch.dtype | None) -> str | None:
    """OpenVINO's ``INFERENCE_PRECISION_HINT`` for a half dtype (``bf16``, ``f16``); None for
    any other dtype."""
    return _HALF_TYPE.get(dtype) if dtype is not None else None
