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

from embedl_dynamo.runtimes.onnx_export import export_onnx
from embedl_dynamo.runtimes.onnxruntime import create_session

__all__ = ["LayerTimes", "node_times", "profile_graph"]

logger = logging.getLogger(__name__)

_KERNEL_SUFFIX = "_kernel_time"
_WARMUP = 5  # untimed runs first: thread pools and allocators settle


class LayerTimes:
    """Node times of one profiled graph (milliseconds per run) and its whole-model median."""

    def __init__(self, nodes: Mapping[str, float], total_ms: float) -> None:
        self.nodes = dict(nodes)
        self.total_ms = total_ms
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
    """Export ``gm``, run it ``runs`` times on ONNX Runtime's CPU provider with profiling on.

    Args:
        gm: a frozen graph (float, cast or fake-quant).
        inputs: its inputs.
        runs: timed runs of the plain session (after untimed warm-up runs) and of the
            profiling session.
        num_threads: intra-op threads (ONNX Runtime's default when None).

    Returns:
        The :class:`LayerTimes`.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="embedl_profile_") as tmp:
        path = export_onnx(gm, list(inputs), Path(tmp) / "model.onnx", dynamic_batch=False)
        plain = create_session(path, ["CPUExecutionProvider"], num_threads=num_threads)
        feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(plain.get_inputs(), inputs)}
        for _ in range(_WARMUP):
            plain.run(None, feeds)
        walls = []
        for _ in range(runs):
            start = time.perf_counter()
            plain.run(None, feeds)
            walls.append(time.perf_counter() - start)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = create_session(
            path, ["CPUExecutionProvider"], num_threads=num_threads, options=options
        )
        for _ in range(runs):
            session.run(None, feeds)
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    return LayerTimes(node_times(events, runs), statistics.median(walls) * 1000.0)
