"""The ``openvino`` runtime: the same ONNX artifact, compiled by OpenVINO's CPU plugin.

OpenVINO reads the ONNX file the ONNX Runtime path exports (float, or QDQ INT8, which its
low-precision transformations turn into integer kernels), with every dynamic axis kept
dynamic, compiled by :func:`~.compile.compile_openvino` in the precision the file asks for:
a float file in ``f32``, never silently lower (on CPUs with bf16 OpenVINO's default would
compute a float model in bf16); a ``bf16``/``fp16`` file (``precision="bf16"``), or an INT8
file whose unquantized layers ``mixed`` chose to run in bf16, in that type where the CPU
computes in it (AVX512_BF16 or AMX), else in ``f32``, which ``build_info`` and a warning say.

The half precisions have a second form here: the *float* file whose metadata asks for the half
type (:mod:`~embedl_dynamo.graph.rest_precision`), compiled with it as
``INFERENCE_PRECISION_HINT``, so the CPU plugin picks its own f32 islands (norms, reductions,
pooling) instead of running the typed graph's casts; which form runs is decided by timing
both (:mod:`embedl_dynamo.tuning.half_form`).
``openvino`` is imported lazily (``pip install 'openvino>=2025.0'``).
:meth:`OpenVINORuntime.load_artifact` compiles an exported ``.onnx`` file the same way
(``embedl_dynamo.load`` for the openvino target's files), on the CPU or an OpenVINO GPU.

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

import contextlib
import importlib.util
import logging
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.cache.keys import package_version
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact
from embedl_dynamo.quant.int8.stage import QUANTIZATION_META
from embedl_dynamo.runtimes.base import PROFILE_WARMUP_RUNS, LayerProfiler
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.openvino.compile import (
    compile_openvino,
    cpu_capabilities,
    openvino_cause,
)
from embedl_dynamo.runtimes.openvino.compiled_cache import compile_or_import
from embedl_dynamo.runtimes.openvino.int_range import check_int32_range
from embedl_dynamo.runtimes.openvino.precisions import (
    NOT_COMPUTE,
    PRECISION_NAME,
    PRECISION_RANK,
    integer_layers,
)
from embedl_dynamo.runtimes.served import Served
from embedl_dynamo.settings import Settings

__all__ = [
    "OpenVINORuntime",
    "openvino_node_times",
]

logger = logging.getLogger(__name__)


class OpenVINORuntime(OnnxArtifactRuntime):
    """OpenVINO ``CompiledModel`` over the cached ONNX artifact, on the CPU."""

    name = "openvino"
    artifact_suffixes = (".onnx",)
    auto_rank = 20
    cpu_target = OPENVINO

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        super().__init__(settings, dynamic_axes)
        self._compiled: Any = None
        self._request: Any = None
        self._static_shapes: list[tuple[int, ...]] | None = None
        self._dynamic: tuple[Any, Any] | None = None  # (compiled, request) for other sizes
        self._device, self._hint = "CPU", None  # a loaded file's (load_artifact)

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("openvino") is None:
            return "the openvino package is not installed (pip install 'openvino>=2025.0')"
        return None

    @classmethod
    def version(cls) -> str | None:
        return package_version("openvino")

    @classmethod
    def layer_profiler(cls) -> LayerProfiler:
        return openvino_node_times

    @classmethod
    def rest_precision(cls) -> str | None:
        """``bf16`` on a CPU OpenVINO computes it on (AVX512_BF16 or AMX), where the CPU
        plugin runs matrix work about twice as fast as in f32; else None."""
        return "bf16" if "BF16" in cpu_capabilities() else None

    @classmethod
    def load_artifact(
        cls,
        path: Path,
        settings: Settings | None = None,
        *,
        device: str = "CPU",
        hint: str | None = None,
    ) -> OpenVINORuntime:
        """A compiled model over an ``.onnx`` file, in the precision the file asks for
        (:func:`~.compile.compile_openvino`: its half type, or the ``embedl_dynamo.rest_precision``
        metadata as ``INFERENCE_PRECISION_HINT``, where the device computes in it).

        Args:
            path: the ``.onnx`` file.
            settings: the settings (``num_threads``).
            device: an OpenVINO device here (``CPU``, ``GPU``, ``GPU.1``; ``auto``: the CPU).
            hint: an ``INFERENCE_PRECISION_HINT`` (``bf16``, ``f16``, ``f32``) instead of the
                file's.

        Raises:
            ValueError: OpenVINO has no such device here (the message lists the ones it has).
        """
        cls.require()
        import openvino as ov

        device = "CPU" if device.strip().lower() == "auto" else device.strip().upper()
        available = ov.Core().available_devices
        if device not in available:
            raise ValueError(
                f"OpenVINO has no device {device!r} here (its devices: {', '.join(available)}); "
                "use device='CPU', or runtime='onnxruntime' for a CUDA GPU"
            )
        runtime = cls(settings)
        runtime._artifact = OnnxArtifact.of_file(path)
        runtime._device, runtime._hint = device, hint
        runtime.mark_loaded(Path(path), options={"device": device, "hint": hint}, device=device)
        return runtime

    @property
    def device(self) -> torch.device:
        """OpenVINO's ``GPU`` (``GPU.1``) is an Intel GPU, PyTorch's ``xpu``; its CPU, and
        ``AUTO``'s or an NPU's host memory, the CPU."""
        kind, _, index = self._device.upper().partition(".")
        if kind == "GPU":
            return torch.device("xpu", int(index) if index.isdigit() else 0)
        return torch.device("cpu")

    @property
    def input_names(self) -> list[str]:
        return [p.any_name for p in self._compiled.inputs] if self._compiled else []

    @property
    def output_names(self) -> list[str]:
        return [p.any_name for p in self._compiled.outputs] if self._compiled else []

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        axes = self.dynamic_axes
        # Dynamo calls a static graph with these sizes only. Not for a Q/DQ graph: with the
        # sizes fixed, the CPU plugin's low-precision passes left half of a ViT's INT8
        # FullyConnected layers in f32
        quantized = QUANTIZATION_META in gm.meta
        if axes is not None and axes.static_graph and not quantized:
            self._static_shapes = [tuple(t.shape) for t in example_inputs]
        artifact = self.artifact(gm, example_inputs)
        self.build_info = {"key": artifact.key, "artifact": str(artifact.final), "device": "CPU"}
        self._activate()
        self.check_artifact(gm, example_inputs, "OpenVINO model")

    def _activate(self) -> None:
        if self._compiled is not None:
            return
        # the file, once written: OpenVINO maps its weights, where parsing the same bytes
        # from memory would copy them
        path = self.read_artifact()
        self._compiled = compile_or_import(
            path,
            self.artifact_digest(),
            self.confirm_artifact,
            self.settings.cache_dir,
            self.build_info,
            num_threads=self.settings.num_threads,
            hint=self._hint,
            shapes=self._static_shapes,
            device=self._device,
        )
        self._request = self._compiled.create_infer_request()
        self.build_info.update(integer_layers(self.layer_precisions()))

    def _compute_layers(self) -> Iterator[tuple[str, str, str]]:
        """``(layer type, runtime precision, original layer names)`` of every compute layer of
        OpenVINO's runtime model (not data, layout or shape bookkeeping)."""
        if self._compiled is None:
            return
        for op in self._compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            if kind in NOT_COMPUTE:
                continue
            precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
            names = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
            yield kind, precision, names

    def layer_precisions(self) -> Counter[tuple[str, str]]:
        """What the CPU plugin runs: ``(layer type, precision) -> count`` over the compute
        layers of OpenVINO's runtime model (``Convolution``, ``FullyConnected``, ``MatMul``,
        ``Subgraph`` for fused attention, ``Eltwise``, ...), precision ``u8``/``i8``/``f32``."""
        return Counter((kind, precision) for kind, precision, _ in self._compute_layers())

    def module_precisions(self) -> dict[str, str]:
        """Module name -> the precision the CPU plugin runs its compute layers in (``bf16``,
        ``fp32``, ``int8``; the lowest where a module has several), from the runtime model's
        ``originalLayersNames`` (the exporter names nodes ``/gm/<module>/<op>``)."""
        found: dict[str, str] = {}
        for _, runtime_precision, names in self._compute_layers():
            precision = PRECISION_NAME.get(runtime_precision)
            for name in names.split(",") if precision is not None else ():
                parts = name.split("/")
                if len(parts) > 2 and parts[1] == "gm":
                    known = found.get(parts[2])
                    if known is None or PRECISION_RANK[precision] < PRECISION_RANK[known]:
                        found[parts[2]] = precision
        return found

    def _deactivate(self) -> None:
        self._request = None  # before the compiled model, which may hold the memory it reads
        self._dynamic = None
        self._compiled = None

    def serve(self) -> Served:
        # a compiled graph of static sizes is called with those only: the dynamic model the
        # compile's checks on other sizes needed (calibration batches) is released
        self._dynamic = None
        return super().serve()

    def _for_shapes(self, args: Sequence[torch.Tensor]) -> tuple[Any, Any]:
        """(compiled model, infer request) for these inputs: the one built for the static
        sizes, or, for other sizes, the file's dynamic model, compiled once when first needed."""
        if self._static_shapes is None or [tuple(t.shape) for t in args] == self._static_shapes:
            return self._compiled, self._request
        if self._dynamic is None:
            compiled = compile_openvino(
                self._artifact.path, self.settings.num_threads, hint=self._hint, device=self._device
            )
            self._dynamic = (compiled, compiled.create_infer_request())
        return self._dynamic

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        check_int32_range(args)
        compiled, request = self._for_shapes(args)
        if len(args) != len(compiled.inputs):
            raise ValueError(f"expected {len(compiled.inputs)} inputs, got {len(args)}")
        device = args[0].device if args else torch.device("cpu")
        # np.require keeps a 0-d input 0-d (np.ascontiguousarray makes it shape (1,), which a
        # model compiled for static sizes refuses)
        feeds = [np.require(t.detach().cpu().numpy(), requirements="C") for t in args]
        with _cause_named():
            results = _run_shared(request, feeds)
        outputs = [results[port] for port in compiled.outputs]
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
        check_int32_range(args)
        count = len(self._compiled.outputs)
        static = self._for_shapes(args)[0] is self._compiled
        if len(args) != len(self._compiled.inputs) or not in_place or not static:
            return self._infer(args)
        aliased = {output % count: k for k, output in in_place.items() if -count <= output < count}
        usable = all(t.device.type == "cpu" and t.is_contiguous() for t in args)
        if not usable or len(aliased) != len(in_place) or any(_no_numpy(t) for t in args):
            return self._infer(args)
        request = self._request
        for i, t in enumerate(args):
            request.set_input_tensor(i, _shared(t.detach().numpy()))
        for i, k in aliased.items():
            request.set_output_tensor(i, _shared(args[k].detach().numpy()))
        try:
            with _cause_named():
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


@contextlib.contextmanager
def _cause_named() -> Iterator[None]:
    """An OpenVINO inference error whose message starts with the cause (its first lines name
    only the C++ source files it passed through, which the fallback warning would show)."""
    try:
        yield
    except RuntimeError as exc:
        raise RuntimeError(f"OpenVINO inference failed: {openvino_cause(exc)}") from exc


def _run_shared(request: Any, feeds: list[np.ndarray]) -> Any:
    """Run ``request`` on ``feeds`` read where they are; its outputs as views of the request's
    buffers (``share_outputs``: the caller copies them before the next run).

    Each array becomes the request's input tensor over its own memory (an 8-image batch is not
    copied: 4.8 MB a call), set directly rather than through ``infer(feeds, share_inputs=True)``,
    whose Python dispatch of the inputs costs a small model's call several percent. The run is
    synchronous, and every later call sets its inputs anew before running. An array the port
    does not take as it is (another element type) goes through that dispatch, which converts."""
    try:
        for index, array in enumerate(feeds):
            request.set_input_tensor(index, _shared(array))
    except (RuntimeError, TypeError):
        return request.infer(feeds, share_inputs=True, share_outputs=True)
    return request.infer(share_outputs=True)


def _shared(array: np.ndarray) -> Any:
    """An ``ov.Tensor`` over a C-contiguous array's memory (no copy)."""
    import openvino as ov

    return ov.Tensor(array, shared_memory=True)


def _own(tensor: Any) -> Any:
    """A new ``ov.Tensor`` of ``tensor``'s type and shape, in memory of its own."""
    import openvino as ov

    return ov.Tensor(tensor.get_element_type(), tensor.get_shape())


def _no_numpy(tensor: torch.Tensor) -> bool:
    return tensor.dtype in (torch.bfloat16, torch.complex32) or tensor.dtype.is_complex


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
