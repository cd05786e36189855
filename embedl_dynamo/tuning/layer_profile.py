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
import logging
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import torch
from torch import fx

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact
from embedl_dynamo.tuning.timer import time_options

__all__ = ["LayerTimes", "profile_graph", "time_graphs"]

logger = logging.getLogger(__name__)


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
        runtime: the name of a runtime with a layer profiler (``onnxruntime``, ``openvino``).
        artifact: ``gm``'s ONNX artifact (:func:`~.artifacts.onnx_artifact`: the very file the
            runtime deploys) to profile; without, a static export in a temporary file.

    Returns:
        The :class:`LayerTimes`.
    """
    classes = runtime_classes()
    profiler = classes[runtime].layer_profiler() if runtime in classes else None
    if profiler is None:
        profiled = [name for name, cls in classes.items() if cls.layer_profiler() is not None]
        raise ValueError(
            f"no layer profiler for runtime {runtime!r}; use one of: {', '.join(profiled)}"
        )
    with tempfile.TemporaryDirectory(prefix="embedl_profile_") as tmp:
        if artifact is not None:
            path = artifact.path
        else:
            path = export_onnx(gm, list(inputs), Path(tmp) / "model.onnx", dynamic_batch=False)
        return LayerTimes(profiler(path, inputs, runs, num_threads))


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
    num_threads: int | None = None,
    settings: Settings | None = None,
    axes: DynamicAxes | None = None,
    runtime: type[Runtime] = OnnxRuntime,
    judge: Callable[[str, Runtime], bool] | None = None,
    artifacts: Mapping[str, OnnxArtifact] | None = None,
) -> dict[str, float]:
    """Median milliseconds per run of each graph on ``runtime``
    (:func:`~embedl_dynamo.tuning.timer.time_options`: round-robin).

    Whole graphs are compared this way rather than by separate profiles: a machine's load and
    clock changes hit every candidate alike.

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
        timings = time_options({name: partial(r.infer, *inputs) for name, r in built.items()})
        for built_runtime in built.values():
            built_runtime.deactivate()
    return timings
