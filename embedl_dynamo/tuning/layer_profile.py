"""Per-layer latency from the runtime's own profiler, and whole-graph timing on a runtime.

ONNX Runtime's profiler (``SessionOptions.enable_profiling``) and OpenVINO's performance counters
(``PERF_COUNT``) time every node of the *optimised* graph, after their QDQ fusions
(``QLinearConv``, OpenVINO's integer convolutions, ...) and layout transforms. The TorchScript
exporter names each node after the module that made it (``/gm/conv_bn_relu_layer1_0_conv1/Conv``),
and each fake-quant module after the value it quantizes (``/gm/fq_<node>/QuantizeLinear``); both
runtimes keep those names on the nodes they run (a fused node keeps its main op's name), so
node times map back to the graph's layers:

* a layer's own time: the nodes under its module's name (its convolution, its weight's
  DequantizeLinear);
* its share of the activation Q/DQ it asked for: a Q/DQ pair two layers share is split evenly.

Nodes a runtime creates itself (layout reorders) belong to no layer; they count only in the
whole-model time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime, create_session
from embedl_dynamo.runtimes.openvino.runtime import compile_openvino
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact

__all__ = ["LayerTimes", "node_times", "profile_graph", "time_graphs"]

logger = logging.getLogger(__name__)

_KERNEL_SUFFIX = "_kernel_time"
_WARMUP = 5  # untimed runs first: thread pools and allocators settle


class LayerTimes:
    """Node times of one profiled graph, milliseconds per run."""

    def __init__(self, nodes: Mapping[str, float]) -> None:
        self.nodes = dict(nodes)
        self._by_segment: dict[str, float] = defaultdict(float)
        for name, ms in self.nodes.items():
            parts = name.split("/")
            if len(parts) > 2:  # "", "gm", "<module or fq_node>", ...
                self._by_segment[parts[2]] += ms

    def module_ms(self, module: str) -> float | None:
        """Time of the nodes under ``module``'s name (None: no node has that name)."""
        return self._by_segment.get(module)

    def quantizer_ms(self, node: str) -> float:
        """Time of the Q/DQ nodes of the fake-quant module on value ``node`` (0 when fused)."""
        return self._by_segment.get(f"fq_{node}", 0.0)


def node_times(profile: Sequence[Mapping[str, Any]], runs: int) -> dict[str, float]:
    """Milliseconds per run of each node, from ONNX Runtime's profile events."""
    totals: dict[str, float] = defaultdict(float)
    for event in profile:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith(_KERNEL_SUFFIX):
            totals[name[: -len(_KERNEL_SUFFIX)]] += float(event.get("dur", 0)) / 1000.0
    return {name: total / runs for name, total in totals.items()}


def _onnxruntime_node_times(
    path: Path, inputs: Sequence[torch.Tensor], runs: int, num_threads: int | None, tmp: str
) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tmp, "profile")
    session = create_session(
        path, ["CPUExecutionProvider"], num_threads=num_threads, options=options
    )
    feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), inputs)}
    for _ in range(runs + _WARMUP):
        session.run(None, feeds)
    with open(session.end_profiling(), encoding="utf-8") as f:
        events = json.load(f)
    return node_times(events, runs + _WARMUP)


def _openvino_node_times(
    path: Path, inputs: Sequence[torch.Tensor], runs: int, num_threads: int | None
) -> dict[str, float]:
    """Median ms per node over ``runs`` calls, from OpenVINO's performance counters."""
    request = compile_openvino(path, num_threads, {"PERF_COUNT": True}).create_infer_request()
    feeds = [t.detach().cpu().numpy() for t in inputs]
    for _ in range(_WARMUP):
        request.infer(feeds)
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        request.infer(feeds)
        for info in request.profiling_info:
            if str(info.status).endswith(".EXECUTED"):
                samples[info.node_name].append(info.real_time.total_seconds() * 1000.0)
    return {name: statistics.median(v) for name, v in samples.items()}


def profile_graph(
    gm: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    runs: int = 20,
    num_threads: int | None = None,
    runtime: str = "onnxruntime",
    artifact: OnnxArtifact | None = None,
) -> LayerTimes:
    """Run ``gm``'s ONNX file with ``runtime``'s profiler on (its CPU device).

    Args:
        gm: a frozen graph (float, cast or fake-quant).
        inputs: its inputs.
        runs: profiled runs (after a few warm-up runs).
        num_threads: intra-op threads (the runtime's default when None).
        runtime: ``onnxruntime`` or ``openvino``.
        artifact: ``gm``'s ONNX artifact (:func:`~.artifacts.onnx_artifact`: the very file the
            runtime deploys) to profile; without, a static export in a temporary file.

    Returns:
        The :class:`LayerTimes`.
    """
    if runtime not in ("onnxruntime", "openvino"):
        raise ValueError(f"no layer profiler for runtime {runtime!r}; use onnxruntime or openvino")
    with tempfile.TemporaryDirectory(prefix="embedl_profile_") as tmp:
        if artifact is not None:
            path = artifact.path
        else:
            path = export_onnx(gm, list(inputs), Path(tmp) / "model.onnx", dynamic_batch=False)
        if runtime == "openvino":
            return LayerTimes(_openvino_node_times(path, inputs, runs, num_threads))
        return LayerTimes(_onnxruntime_node_times(path, inputs, runs, num_threads, tmp))


def _build_runtime(
    runtime: Runtime,
    gm: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    artifact: OnnxArtifact | None,
) -> Runtime:
    """``runtime`` built for ``gm``; from ``artifact`` (``gm``'s ONNX file, already keyed) when
    given and the runtime runs ONNX artifacts, so the graph is not fingerprinted again."""
    if artifact is not None and isinstance(runtime, OnnxArtifactRuntime):
        runtime.use_artifact(artifact)
    return runtime.build(gm, inputs, judge_artifact)


def time_graphs(
    graphs: Mapping[str, fx.GraphModule],
    inputs: Sequence[torch.Tensor],
    rounds: int = 15,
    num_threads: int | None = None,
    settings: Settings | None = None,
    axes: DynamicAxes | None = None,
    runtime: type[Runtime] = OnnxRuntime,
    judge: Callable[[str, Runtime], bool] | None = None,
    artifacts: Mapping[str, OnnxArtifact] | None = None,
) -> dict[str, float]:
    """Median milliseconds per run of each graph on ``runtime``, timed round-robin.

    Whole graphs are compared this way rather than by separate profiles: a machine's load and
    clock changes hit every candidate alike. Each round calls each graph three times and times
    the last two, so one runtime's spinning worker threads do not bill the next.

    Each graph is built as the runtime builds it (the cached ONNX artifact with the same dynamic
    axes: ``axes``, or the batch per ``settings``), so the runtime later reuses the very file
    timed. Without ``settings``, static exports in a temporary cache. ``artifacts`` gives the
    ONNX artifacts already made (with these ``settings`` and ``axes``) for some graphs, by name:
    those are built from them, not keyed again. ``judge(name, runtime)`` sees each built graph
    first; one it refuses is not timed (nor in the result).
    """
    with tempfile.TemporaryDirectory(prefix="embedl_timing_") as tmp:
        if settings is None:
            settings = Settings(cache_dir=Path(tmp), dynamic_batch=False, num_threads=num_threads)
        elif num_threads is not None:
            settings = dataclasses.replace(settings, num_threads=num_threads)
        made = artifacts or {}
        built = {
            name: _build_runtime(runtime(settings, axes), gm, inputs, made.get(name))
            for name, gm in graphs.items()
        }
        if judge is not None:
            built = {name: r for name, r in built.items() if judge(name, r)}
        for built_runtime in built.values():
            for _ in range(_WARMUP):
                built_runtime.infer(*inputs)
        samples: dict[str, list[float]] = {name: [] for name in built}
        for _ in range(rounds):
            for name, built_runtime in built.items():
                for call in range(3):
                    start = time.perf_counter()
                    built_runtime.infer(*inputs)
                    if call:
                        samples[name].append(time.perf_counter() - start)
        for built_runtime in built.values():
            built_runtime.deactivate()
    return {name: statistics.median(v) * 1000.0 for name, v in samples.items()}
