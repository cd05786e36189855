"""The ``openvino`` runtime: the same ONNX artifact, compiled by OpenVINO's CPU plugin.

OpenVINO reads the ONNX file the ONNX Runtime path exports (float, or QDQ INT8, which its
low-precision transformations turn into integer kernels), with every dynamic axis kept
dynamic, after :mod:`.openvino_lowering` maps the ops its ONNX frontend would leave unfused.
The precision follows the file (``INFERENCE_PRECISION_HINT``, :func:`inference_precision`): a
float file runs in ``f32``, never silently lower (on CPUs with bf16 OpenVINO's default would
compute a float model in bf16); a ``bf16``/``fp16`` file (``precision="bf16"``) runs in that
type where the CPU computes in it (AVX512_BF16 or AMX, where it is faster than f32), else in
``f32`` with its half weights, which ``build_info`` and a warning say.

The half precisions have a second form here: :class:`OpenVINOHalfHintRuntime` compiles the
*float* file with the half type as ``INFERENCE_PRECISION_HINT``, so the CPU plugin picks its own
f32 islands (norms, reductions, pooling) instead of running the typed graph's casts; which
form runs is decided by timing both (:mod:`embedl_dynamo.tuning.half_form`).
``openvino`` is imported lazily (``pip install embedl-dynamo[openvino]``).

OpenVINO's own ``torch.compile(backend="openvino")`` fails on torch 2.13 (a Dynamo guard
error); this runtime is a working route from ``torch.compile`` to OpenVINO. Its layer profiler
(:func:`openvino_node_times`) reads the CPU plugin's performance counters (``PERF_COUNT``).

A written-back input the caller lets the runtime update in place (a KV cache,
:meth:`~embedl_dynamo.runtimes.base.Runtime.infer`'s ``in_place``) is given to the infer request
as both that input and its output tensor, each an ``ov.Tensor`` over the caller's
memory (``shared_memory=True``), so a decode step neither copies the cache in nor out. Not a
stateful model (ReadValue/Assign, as optimum-intel exports decoders): the cache stays the
caller's tensor, which Hugging Face's static cache owns and resets, and the same ONNX artifact
serves both runtimes.
"""

from __future__ import annotations

import importlib.util
import logging
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.errors import error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.runtimes.base import PROFILE_WARMUP_RUNS, LayerProfiler, package_version
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.openvino.lowering import lower_for_openvino
from embedl_dynamo.settings import Settings

__all__ = [
    "OpenVINOHalfHintRuntime",
    "OpenVINORuntime",
    "compile_openvino",
    "half_hint",
    "inference_precision",
    "openvino_cause",
    "openvino_node_times",
]

logger = logging.getLogger(__name__)

_INTEGER = ("u8", "i8")
# OpenVINO's half element type -> the CPU plugin's OPTIMIZATION_CAPABILITIES entry computing it
_HALF_CAPABILITY = {"bf16": "BF16", "f16": "FP16"}
_HALF_TYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}
# runtime-model nodes that compute nothing (data, layout, shape bookkeeping)
_NOT_COMPUTE = frozenset(
    {"Const", "Input", "Output", "Parameter", "Result", "Reshape", "Reorder", "Transpose",
     "ShapeOf", "Gather", "Concatenation", "Broadcast", "Convert", "StridedSlice", "Split"}
)  # fmt: skip


def openvino_cause(exc: BaseException) -> str:
    """The line of an OpenVINO error that says what is wrong (its first lines only name the
    C++ source files the exception passed through: ``Exception from src/...cpp:117:``)."""
    return error_line(exc, with_type=False, skip=("Exception from ",))


def compile_openvino(
    path: Path,
    num_threads: int | None = None,
    config: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    hint: str | None = None,
) -> Any:
    """An ``openvino.CompiledModel`` of the ONNX file ``path`` on the CPU: the one place this
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

    Raises:
        RuntimeError: OpenVINO cannot compile it, or ``hint`` is a type this CPU does not
            compute in; the message names the cause.
    """
    import openvino as ov

    core = ov.Core()
    capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if hint is not None and _HALF_CAPABILITY.get(hint, hint.upper()) not in capabilities:
        raise RuntimeError(
            f"this CPU does not compute in {hint} (OpenVINO's OPTIMIZATION_CAPABILITIES: "
            f"{', '.join(capabilities)}): its {hint} hint would run f32; use the typed graph "
            "or precision='fp32'"
        )
    try:
        model = core.read_model(str(path))
        precision = hint or inference_precision(model, capabilities)
        note = _half_not_computed(model, capabilities, precision)
        properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, **(config or {})}
        if num_threads is not None:
            properties["INFERENCE_NUM_THREADS"] = num_threads
        lowered = lower_for_openvino(model)
        if info is not None:
            info["inference_precision"] = precision
            if note:
                info["half_precision_note"] = note
            if lowered:
                info["openvino_lowering"] = lowered
        return core.compile_model(model, "CPU", properties)
    except RuntimeError as exc:
        raise RuntimeError(
            f"OpenVINO cannot compile {Path(path).name}: {openvino_cause(exc)}"
        ) from exc


def inference_precision(model: Any, capabilities: Sequence[str]) -> str:
    """OpenVINO's ``INFERENCE_PRECISION_HINT`` for ``model`` on a CPU with ``capabilities``
    (the plugin's ``OPTIMIZATION_CAPABILITIES``).

    ``bf16``/``f16`` where the model carries that type (our ``bf16``/``fp16`` precision casts
    its matmul-class layers) and the CPU computes in it (``BF16``: AVX512_BF16 or AMX;
    ``FP16``: AVX512_FP16 or AMX-FP16); else ``f32``. A float model is never computed in a
    lower precision than it asked for, which the plugin's own default would do on bf16 CPUs.
    """
    carried = _carried_types(model)
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


def _half_not_computed(model: Any, capabilities: Sequence[str], precision: str) -> str:
    """A warning (logged, and returned for ``build_info``) where ``model`` carries a half type
    this CPU does not compute in, so it runs in ``f32``; "" otherwise."""
    if precision != "f32":
        return ""
    missing = [h for h, c in _HALF_CAPABILITY.items() if c not in capabilities]
    carried = [h for h in missing if h in _carried_types(model)]
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


class OpenVINORuntime(OnnxArtifactRuntime):
    """OpenVINO ``CompiledModel`` over the cached ONNX artifact, on the CPU."""

    name = "openvino"
    auto_rank = 20
    cpu_target = OPENVINO

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        super().__init__(settings, dynamic_axes)
        self._compiled: Any = None
        self._request: Any = None

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("openvino") is None:
            return "the openvino package is not installed (pip install embedl-dynamo[openvino])"
        return None

    @classmethod
    def version(cls) -> str | None:
        return package_version("openvino")

    @classmethod
    def layer_profiler(cls) -> LayerProfiler:
        return openvino_node_times

    @property
    def input_names(self) -> list[str]:
        return [p.any_name for p in self._compiled.inputs] if self._compiled else []

    @property
    def output_names(self) -> list[str]:
        return [p.any_name for p in self._compiled.outputs] if self._compiled else []

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        artifact = self.artifact(gm, example_inputs)
        self.build_info = {"key": artifact.key, "artifact": str(artifact.final), "device": "CPU"}
        self._activate()
        self.check_artifact(gm, example_inputs, "OpenVINO model")

    def _activate(self) -> None:
        if self._compiled is not None:
            return
        # the file, once written: OpenVINO maps its weights, where parsing the same bytes
        # from memory would copy them
        path = self._artifact.path
        self._compiled = compile_openvino(
            path, self.settings.num_threads, info=self.build_info, hint=self._hint()
        )
        self._request = self._compiled.create_infer_request()
        integer = {k: v for k, v in self.layer_precisions().items() if k[1] in _INTEGER}
        if integer:
            self.build_info["int8_layers"] = {
                kind: sum(v for (k, _), v in integer.items() if k == kind)
                for kind in sorted({k for k, _ in integer})
            }

    def _hint(self) -> str | None:
        """The ``INFERENCE_PRECISION_HINT`` this runtime forces (None: the file's types decide)."""
        return None

    def layer_precisions(self) -> Counter[tuple[str, str]]:
        """What the CPU plugin runs: ``(layer type, precision) -> count`` over the compute
        layers of OpenVINO's runtime model (``Convolution``, ``FullyConnected``, ``MatMul``,
        ``Subgraph`` for fused attention, ``Eltwise``, ...), precision ``u8``/``i8``/``f32``."""
        counts: Counter[tuple[str, str]] = Counter()
        if self._compiled is None:
            return counts
        for op in self._compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            if kind in _NOT_COMPUTE:
                continue
            precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
            counts[(kind, precision)] += 1
        return counts

    def _deactivate(self) -> None:
        self._compiled = None
        self._request = None

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(args) != len(self._compiled.inputs):
            raise ValueError(f"expected {len(self._compiled.inputs)} inputs, got {len(args)}")
        device = args[0].device if args else torch.device("cpu")
        feeds = [np.ascontiguousarray(t.detach().cpu().numpy()) for t in args]
        results = self._request.infer(feeds)
        outputs = [results[port] for port in self._compiled.outputs]
        # copies: the request reuses its output buffers on the next call
        return tuple(torch.from_numpy(np.array(o)).to(device) for o in outputs)

    def _infer_in_place(
        self, args: Sequence[torch.Tensor], in_place: Mapping[int, int]
    ) -> tuple[torch.Tensor, ...]:
        """Every output ``in_place`` names bound to its input's memory; as :meth:`_infer`
        unless all of them, and every input, are contiguous CPU tensors numpy can view.

        The request keeps the tensors it was given (a later ``infer(feeds)`` copies its inputs
        into them, and writes its outputs there), so right after the run its inputs and those
        outputs get memory of their own again: no later call touches the caller's tensors.
        """
        count = len(self._compiled.outputs)
        if len(args) != len(self._compiled.inputs) or not in_place:
            return self._infer(args)
        aliased = {output % count: k for k, output in in_place.items() if -count <= output < count}
        usable = all(t.device.type == "cpu" and t.is_contiguous() for t in args)
        if not usable or len(aliased) != len(in_place) or any(_no_numpy(t) for t in args):
            return self._infer(args)
        request = self._request
        for i, t in enumerate(args):
            request.set_input_tensor(i, _shared(t))
        for i, k in aliased.items():
            request.set_output_tensor(i, _shared(args[k]))
        try:
            request.infer()
            outputs = [
                args[aliased[i]]
                if i in aliased
                # a copy: the request reuses its own output buffers on the next call
                else torch.from_numpy(np.array(request.get_output_tensor(i).data))
                for i in range(count)
            ]
        finally:  # no later call may read or write the caller's memory
            for i in range(len(args)):
                request.set_input_tensor(i, _own(request.get_input_tensor(i)))
            for i in aliased:
                request.set_output_tensor(i, _own(request.get_output_tensor(i)))
        for i in aliased:
            torch.autograd.graph.increment_version(outputs[i])
        return tuple(outputs)


def _shared(tensor: torch.Tensor) -> Any:
    """An ``ov.Tensor`` over a contiguous CPU tensor's memory."""
    import openvino as ov

    return ov.Tensor(tensor.detach().numpy(), shared_memory=True)


def _own(tensor: Any) -> Any:
    """A new ``ov.Tensor`` of ``tensor``'s type and shape, in memory of its own."""
    import openvino as ov

    return ov.Tensor(tensor.get_element_type(), tensor.get_shape())


def _no_numpy(tensor: torch.Tensor) -> bool:
    return tensor.dtype in (torch.bfloat16, torch.complex32) or tensor.dtype.is_complex


class OpenVINOHalfHintRuntime(OpenVINORuntime):
    """OpenVINO on the *float* graph with ``settings.precision``'s half type as its
    ``INFERENCE_PRECISION_HINT`` (``bf16``/``f16``): the form OpenVINO's own users get, where
    the CPU plugin keeps its precision-sensitive ops in f32 itself. Its build fails, saying so,
    on a CPU that does not compute in that type (it would silently run f32)."""

    def _hint(self) -> str | None:
        hint = half_hint(self.settings.precision.half_dtype)
        if hint is None:
            raise ValueError(
                f"{type(self).__name__} runs a half precision (bf16, fp16), not "
                f"precision={self.settings.precision.name!r}; use OpenVINORuntime"
            )
        return hint


def openvino_node_times(
    path: Path, inputs: Sequence[torch.Tensor], runs: int, num_threads: int | None
) -> dict[str, float]:
    """Median milliseconds per node over ``runs`` calls, from OpenVINO's performance counters.

    Args:
        path: the ONNX file.
        inputs: one tensor per graph input.
        runs: timed runs (after :data:`~embedl_dynamo.runtimes.base.PROFILE_WARMUP_RUNS` untimed ones).
        num_threads: inference threads (OpenVINO's default when None).

    Returns:
        Node name -> median milliseconds per run, over the nodes OpenVINO executed.
    """
    request = compile_openvino(path, num_threads, {"PERF_COUNT": True}).create_infer_request()
    feeds = [t.detach().cpu().numpy() for t in inputs]
    for _ in range(PROFILE_WARMUP_RUNS):
        request.infer(feeds)
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        request.infer(feeds)
        for info in request.profiling_info:
            if str(info.status).endswith(".EXECUTED"):
                samples[info.node_name].append(info.real_time.total_seconds() * 1000.0)
    return {name: statistics.median(v) for name, v in samples.items()}
