"""The ``onnxruntime`` runtime: the transformed graph as ONNX, run by an ``InferenceSession``.

The ONNX file comes from the artifact cache (exported once per content key, dynamic batch
axis, weights as initializers). The session uses the best execution providers installed
(TensorRT EP > CUDA EP > CPU) with graph optimisation level ``ORT_ENABLE_ALL``.

Copies: CPU tensors are handed to ORT as zero-copy numpy views (``Tensor.numpy()`` of a
contiguous tensor shares memory) and outputs come back as ``torch.from_numpy`` views of ORT's
arrays, so no tensor is copied on either side. CUDA tensors go through IO binding with their
device pointers. A written-back input the caller lets the runtime update in place (a KV cache,
:meth:`~embedl_dynamo.runtimes.base.Runtime.infer`'s ``in_place``) is bound, on the CPU, as
both that input and its output (IO binding over the tensor's memory, as onnxruntime-genai's
``past_present_share_buffer`` shares past and present): the CPU scatter kernels skip their
input-to-output copy when both are one buffer, so a decode step copies no cache.

The runtime's layer profiler (:func:`onnxruntime_node_times`) times each node of an ONNX file
from ONNX Runtime's own profile (``SessionOptions.enable_profiling``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.cache.keys import package_version
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact
from embedl_dynamo.runtimes.base import PROFILE_WARMUP_RUNS, LayerProfiler
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.onnxruntime.optimized_cache import (
    LOADED,
    OPTIMIZED_GRAPH,
    cpu_session,
    store_in_background,
)
from embedl_dynamo.runtimes.onnxruntime.session import (
    CPU_PROVIDER,
    create_session,
    device_providers,
    ort_log_severity,
    ort_providers,
)
from embedl_dynamo.settings import Settings

__all__ = [
    "OnnxRuntime",
    "node_times",
    "onnxruntime_node_times",
]

logger = logging.getLogger(__name__)

_KERNEL_SUFFIX = "_kernel_time"


class OnnxRuntime(OnnxArtifactRuntime):
    """ONNX Runtime ``InferenceSession`` over the cached ONNX artifact."""

    name = "onnxruntime"
    artifact_suffixes = (".onnx",)
    auto_rank = 10
    cpu_target = ONNXRUNTIME

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        super().__init__(settings, dynamic_axes)
        self._session: Any = None
        self._input_names: list[str] = []
        self._output_names: list[str] = []

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "the onnxruntime package is not installed (pip install onnxruntime)"
        return None

    @classmethod
    def cuda_missing(cls) -> str | None:
        if cls.missing() is not None:
            return cls.missing()
        providers = ort_providers()
        if any(p != CPU_PROVIDER for p in providers):
            return None
        return (
            f"onnxruntime has no CUDA execution provider here (providers: {', '.join(providers)}; "
            "pip install onnxruntime-gpu)"
        )

    @classmethod
    def version(cls) -> str | None:
        return package_version("onnxruntime", "onnxruntime-gpu")

    @classmethod
    def layer_profiler(cls) -> LayerProfiler:
        return onnxruntime_node_times

    @classmethod
    def load_artifact(
        cls,
        path: Path,
        settings: Settings | None = None,
        *,
        providers: Sequence[str | Sequence[Any]] | None = None,
        device: str | None = None,
    ) -> OnnxRuntime:
        """An active session over an ``.onnx`` file.

        Args:
            path: the ``.onnx`` file.
            settings: the settings (``num_threads``).
            providers: execution providers, best first, each a name or ``(name, provider
                options)`` (``("CUDAExecutionProvider", {"device_id": 1})``; a JSON state's
                ``[name, options]`` too); :func:`ort_providers` when None.
            device: the device instead (``auto``, ``CPU``, ``CUDA``, ``CUDA:1``): its
                providers are :func:`device_providers`'s.

        Raises:
            ValueError: both ``providers`` and ``device``, or a device not available here.
        """
        cls.require()
        if providers is not None and device is not None:
            raise ValueError("give providers or device, not both")
        if device is not None:
            providers, options = device_providers(device), {"device": device}
        chosen = [
            p if isinstance(p, str) else (str(p[0]), dict(p[1]))
            for p in (providers or ort_providers())
        ]
        if device is None:
            options = {"providers": chosen}
        runtime = cls(settings)
        runtime._artifact = OnnxArtifact.of_file(path)
        runtime.mark_loaded(Path(path), options=options, providers=chosen)
        return runtime

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._output_names)

    @classmethod
    def builds_from_memory(cls) -> bool:
        """On the CPU provider alone the session is built from the export in memory
        (``add_external_initializers``) while the file is written."""
        return ort_providers() == [CPU_PROVIDER]

    @property
    def device(self) -> torch.device:
        """A CUDA device where the session's first provider is a GPU one, else the CPU."""
        providers = self.build_info.get("providers") or [CPU_PROVIDER]
        first = providers[0]
        name, options = (first, {}) if isinstance(first, str) else (first[0], dict(first[1]))
        if name == CPU_PROVIDER:
            return torch.device("cpu")
        return torch.device("cuda", int(options.get("device_id", 0)))

    @property
    def providers(self) -> list[str]:
        """The execution providers the session really uses."""
        return list(self._session.get_providers()) if self._session is not None else []

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        artifact = self.artifact(gm, example_inputs)
        self.build_info = {
            "key": artifact.key,
            "artifact": str(artifact.final),
            "providers": ort_providers(),
        }
        self._activate()
        self.check_artifact(gm, example_inputs, "onnxruntime artifact")

    def _activate(self) -> None:
        if self._session is not None:
            return
        providers, threads = self.build_info["providers"], self.settings.num_threads
        unwritten = self._artifact.unwritten
        source = None
        if unwritten is not None and providers == [CPU_PROVIDER]:
            source = unwritten.ort_source()
        if source is not None:  # just exported, still being written: from memory
            model, arrays = source
            self._session = create_session(
                model, providers, num_threads=threads, initializers=arrays
            )
            del model, arrays, source
            self._artifact.unwritten = None  # ORT copied the weights; the writer holds its own
            if providers == [CPU_PROVIDER] and self._artifact.key:
                artifact = self._artifact
                store_in_background(
                    lambda: artifact.path, self.artifact_digest, self.settings.cache_dir, threads
                )
        elif providers == [CPU_PROVIDER]:
            self._session = cpu_session(
                self.read_artifact,
                self.artifact_problem(),
                self.artifact_digest(),
                self.settings.cache_dir,
                threads,
                self.build_info,
            )
            if self.build_info.get(OPTIMIZED_GRAPH) == LOADED:
                self.artifact_not_read()
        else:
            self._session = create_session(self.read_artifact(), providers, num_threads=threads)
        self._input_names = [i.name for i in self._session.get_inputs()]
        self._output_names = [o.name for o in self._session.get_outputs()]

    def _deactivate(self) -> None:
        self._session = None

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(args) != len(self._input_names):
            raise ValueError(f"expected {len(self._input_names)} inputs, got {len(args)}")
        if any(t.device.type == "cuda" for t in args):
            if any(p != CPU_PROVIDER for p in self._session.get_providers()):
                return self._infer_bound(args)
            # a loaded file fed CUDA tensors, on the CPU provider: run it on host copies
            device = next(t.device for t in args if t.device.type == "cuda")
            outputs = self._infer([t.cpu() for t in args])
            return tuple(o.to(device) for o in outputs)
        feeds = {name: t.detach().contiguous().numpy() for name, t in zip(self._input_names, args)}
        outputs = self._session.run(self._output_names, feeds)
        return tuple(torch.from_numpy(o) for o in outputs)

    def _infer_in_place(
        self, args: Sequence[torch.Tensor], in_place: Mapping[int, int]
    ) -> tuple[torch.Tensor, ...]:
        """The outputs ``in_place`` names bound to their inputs' own memory (CPU tensors of a
        numpy type, contiguous; others run as :meth:`_infer` does): ONNX Runtime writes them
        there, and the input's tensor itself is returned in their place, its version counter
        bumped as an in-place op would."""
        if len(args) != len(self._input_names):
            raise ValueError(f"expected {len(self._input_names)} inputs, got {len(args)}")
        if any(t.device.type != "cpu" or t.dtype not in _NUMPY_TYPES for t in args):
            return self._infer(args)
        count = len(self._output_names)
        aliased = {
            output % count: k
            for k, output in in_place.items()
            if -count <= output < count and args[k].is_contiguous() and args[k].numel()
        }
        if not aliased:
            return self._infer(args)
        binding = self._session.io_binding()
        kept = [_bind(binding.bind_input, name, t) for name, t in zip(self._input_names, args)]
        for i, name in enumerate(self._output_names):
            if i in aliased:
                _bind(binding.bind_output, name, args[aliased[i]])
            else:
                binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding)
        del kept  # the inputs' contiguous copies, alive until the run ended
        outputs: list[torch.Tensor] = []
        for i, value in enumerate(binding.get_outputs()):
            if i in aliased:
                target = args[aliased[i]]
                torch.autograd.graph.increment_version(target)
                outputs.append(target)
            else:
                outputs.append(torch.from_numpy(value.numpy()))
        return tuple(outputs)

    def _infer_bound(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """IO binding for CUDA tensors: ORT reads the inputs where they are."""
        binding = self._session.io_binding()
        device = args[0].device
        for name, t in zip(self._input_names, args):
            t = t.detach().contiguous()
            binding.bind_input(
                name,
                t.device.type,
                t.device.index or 0,
                _numpy_dtype(t.dtype),
                tuple(t.shape),
                t.data_ptr(),
            )
        for name in self._output_names:
            binding.bind_output(name, device.type, device.index or 0)
        self._session.run_with_iobinding(binding)
        outputs: list[Any] = binding.copy_outputs_to_cpu()
        return tuple(torch.from_numpy(o).to(device) for o in outputs)


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype


# the tensor types ONNX Runtime's Python binding takes as numpy buffers
_NUMPY_TYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    }
)


def _bind(bind: Callable[..., None], name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Bind ``name`` (an input, or an output to write into) to a CPU tensor's memory; returns
    the tensor bound (a contiguous copy when it is not contiguous), to keep alive until the run
    ends."""
    tensor = tensor.detach().contiguous()
    bind(name, "cpu", 0, _numpy_dtype(tensor.dtype), tuple(tensor.shape), tensor.data_ptr())
    return tensor


def node_times(profile: Sequence[Mapping[str, Any]], runs: int) -> dict[str, float]:
    """Milliseconds per run of each node, from ONNX Runtime's profile events."""
    totals: dict[str, float] = defaultdict(float)
    for event in profile:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith(_KERNEL_SUFFIX):
            totals[name[: -len(_KERNEL_SUFFIX)]] += float(event.get("dur", 0)) / 1000.0
    return {name: total / runs for name, total in totals.items()}


def onnxruntime_node_times(
    path: Path, inputs: Sequence[torch.Tensor], runs: int, num_threads: int | None
) -> dict[str, float]:
    """Milliseconds per run of each node of ``path`` on ONNX Runtime's CPU provider.

    Args:
        path: the ONNX file.
        inputs: one tensor per graph input.
        runs: profiled runs (after :data:`~embedl_dynamo.runtimes.base.PROFILE_WARMUP_RUNS` more, which are averaged in too).
        num_threads: intra-op threads (ONNX Runtime's default when None).

    Returns:
        Node name -> milliseconds per run.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="embedl_ort_profile_") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = ort_log_severity()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = create_session(
            path, ["CPUExecutionProvider"], num_threads=num_threads, options=options
        )
        feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), inputs)}
        for _ in range(runs + PROFILE_WARMUP_RUNS):
            session.run(None, feeds)
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    return node_times(events, runs + PROFILE_WARMUP_RUNS)
