"""One Dynamo subgraph's compile job: which runtime builds it, which are timed, its report.

:func:`route_subgraph` starts the job before anything is frozen or exported: the runtime
candidates for the target (:func:`~embedl_dynamo.runtimes.registry.runtime_candidates`, by
where the graph's tensors are), INT8's route to a CPU runtime's integer kernels, and the CPU
runtimes a float graph is timed on. :class:`SubgraphJob` carries what the compile's stages
(:mod:`embedl_dynamo.dynamo.compile`) share.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.report.record import next_index, record
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.registry import runtime_candidates
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.beat_eager import EagerSpeed, warn_eager_faster
from embedl_dynamo.tuning.routing import cpu_precision_route, int8_route, precision_route

__all__ = ["SubgraphJob", "route_subgraph"]

logger = logging.getLogger(__name__)


# PyTorch's fused fast-path layers (``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention``
# in eval): one node each, decomposed into a layer's ops (projections, attention, norms) by the
# patterns, so a two-layer ``nn.TransformerEncoder`` is not "2 ops < min_subgraph_size"
_FUSED_LAYER_OPS = {
    torch._transformer_encoder_layer_fwd: 10,
    torch._native_multi_head_attention: 4,
}


def _count_ops(gm: fx.GraphModule) -> int:
    """The graph's ops, a fused fast-path layer counted as the ops it decomposes into."""
    return sum(
        _FUSED_LAYER_OPS.get(n.target, 1)
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )


@dataclasses.dataclass
class SubgraphJob:
    """What the stages of one subgraph's compile share."""

    backend: Backend
    settings: Settings
    report: SubgraphReport
    runtime_cls: type[Runtime]
    timed: list[type[Runtime]]  # CPU runtimes float graphs are timed on (none, or 2+)
    start: float
    inputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    axes: DynamicAxes | None = None
    original: fx.GraphModule | None = None  # the frozen graph before any rewrite: the reference
    on_cuda: bool = False  # the graph's tensors are on a CUDA device
    # graph input position -> the largest magnitude INT8 calibration saw there (watched)
    input_bounds: dict[int, float] = dataclasses.field(default_factory=dict)
    # how the pipeline derived its constants from the weights, for a refit (dynamo.refit)
    weight_recipe: WeightRecipe | None = None
    # what the runtime raised when it failed on the graph (its build, export or first-call
    # check), for narrowing the failure to the ops that cause it (dynamo.narrowing)
    failure: Exception | None = None

    def stay_eager(self, status: str, reason: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Record that the subgraph runs in PyTorch (``fn``) and why."""
        self.report.status, self.report.reason = status, reason
        self.report.compile_s = time.perf_counter() - self.start
        record(self.report)
        logger.info("subgraph %d stays in PyTorch: %s", self.report.index, reason)
        return fn

    def float_won(self, note: str, what: str = "the float graph") -> None:
        """The float graph on another runtime (or in PyTorch) beat the mixed one: its layers
        run fp32."""
        pipeline = dict(self.report.pipeline, quantized=False)
        pipeline.pop("quantization", None)
        pipeline.pop("judged", None)
        pipeline["layers"] = [
            dict(r, precision="fp32", reason=f"{what} ran faster ({note})")
            for r in pipeline.get("layers", [])
        ]
        self.report.pipeline = pipeline

    def eager_won(self, speed: EagerSpeed, note: str) -> None:
        """PyTorch beat every runtime (:mod:`~embedl_dynamo.tuning.beat_eager`): the original
        graph runs; the report gives both times (``note``) and one warning says it."""
        report = self.report
        report.status, report.runtime, report.reason = "eager", "eager", note
        if report.pipeline.get("quantized"):  # mixed: its INT8 layers do not run
            self.float_won(note, "PyTorch")
        report.pipeline = dict(report.pipeline, eager_speed=speed.to_dict())
        warn_eager_faster(speed, report.index)


def route_subgraph(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Backend, settings: Settings
) -> SubgraphJob:
    """Which runtime builds the subgraph, which are timed, and the report it starts."""
    start = time.perf_counter()
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    # a forced, missing runtime raises
    candidates = runtime_candidates(settings.runtime, backend, on_cuda)
    # the precision rules were measured on CPUs; on CUDA the target's order stands
    candidates, preferred = (
        (candidates, "") if on_cuda else precision_route(candidates, settings.precision)
    )
    runtime_cls, route = int8_route(candidates[0], settings.precision)
    report = SubgraphReport(
        index=next_index(), backend=backend.name, runtime="eager", ops=_count_ops(gm), status=""
    )
    backend, cpu_route = cpu_precision_route(runtime_cls, backend, settings)
    report.reason = "; ".join(r for r in (preferred, route or cpu_route) if r)
    # with several CPU runtimes, float graphs (and mixed against float) are timed on each
    timed = [] if on_cuda else [c for c in candidates if c.cpu_target is not None]
    if len(timed) < 2:
        timed = []
    return SubgraphJob(backend, settings, report, runtime_cls, timed, start, on_cuda=on_cuda)
