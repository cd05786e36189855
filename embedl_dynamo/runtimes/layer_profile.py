"""Per-layer latency on ONNX Runtime, from its own profiler.

ONNX Runtime's profiler (``SessionOptions.enable_profiling``) times every node of the
*optimised* graph, after its QDQ fusions (``QLinearConv``, ``QLinearAdd``, ...) and layout
transforms. The TorchScript exporter names each node after the module that made it
(``/gm/conv_bn_relu_layer1_0_conv1/Conv``), and each fake-quant module after the value it
quantizes (``/gm/fq_<node>/QuantizeLinear``), so node times map back to the graph's layers:

* a layer's own time: the nodes under its module's name (its convolution, its weight's
  DequantizeLinear);
* its share of the activation Q/DQ it asked for: a Q/DQ pair two layers share is split evenly.

Nodes ONNX Runtime creates itself (layout reorders) belong to no layer; they count only in the
whole-model time.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.runtimes.artifacts import onnx_artifact
from embedl_dynamo.runtimes.onnx_export import export_onnx
from embedl_dynamo.runtimes.onnxruntime import create_session
from embedl_dynamo.settings import Settings

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


def profile_graph(
    gm: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    runs: int = 20,
    num_threads: int | None = None,
) -> LayerTimes:
    """Export ``gm``, run it on ONNX Runtime's CPU provider with its profiler on.

    Args:
        gm: a frozen graph (float, cast or fake-quant).
        inputs: its inputs.
        runs: profiled runs (a few warm-up runs more are averaged in).
        num_threads: intra-op threads (ONNX Runtime's default when None).

    Returns:
        The :class:`LayerTimes`.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="embedl_profile_") as tmp:
        path = export_onnx(gm, list(inputs), Path(tmp) / "model.onnx", dynamic_batch=False)
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
    return LayerTimes(node_times(events, runs + _WARMUP))


def time_graphs(
    graphs: Mapping[str, fx.GraphModule],
    inputs: Sequence[torch.Tensor],
    rounds: int = 15,
    num_threads: int | None = None,
    settings: Settings | None = None,
    axes: DynamicAxes | None = None,
) -> dict[str, float]:
    """Median milliseconds per run of each graph on ONNX Runtime, timed round-robin.

    Whole graphs are compared this way rather than by separate profiles: a machine's load and
    clock changes hit every candidate alike. Each round calls each session three times and times
    the last two, so one session's spinning worker threads do not bill the next.

    With ``settings``, each graph is timed as the file the runtime will deploy: the cached ONNX
    artifact with the same dynamic axes (``axes``; Dynamo's, or the batch per ``settings``),
    which the runtime then reuses instead of exporting again. Without, a static export.
    """
    with tempfile.TemporaryDirectory(prefix="embedl_timing_") as tmp:
        sessions = {}
        for index, (name, gm) in enumerate(graphs.items()):
            if settings is not None:
                path = onnx_artifact(gm, list(inputs), settings, axes)[0]
            else:
                path = export_onnx(
                    gm, list(inputs), Path(tmp) / f"{index}.onnx", dynamic_batch=False
                )
            session = create_session(path, ["CPUExecutionProvider"], num_threads=num_threads)
            feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), inputs)}
            for _ in range(_WARMUP):
                session.run(None, feeds)
            sessions[name] = (session, feeds)
        samples: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(rounds):
            for name, (session, feeds) in sessions.items():
                for call in range(3):
                    start = time.perf_counter()
                    session.run(None, feeds)
                    if call:
                        samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) * 1000.0 for name, v in samples.items()}
