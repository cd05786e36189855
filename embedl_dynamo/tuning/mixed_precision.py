"""``precision="mixed"``: per layer INT8, the runtime's half type or fp32, by measured latency
within the budget.

Given a calibrated graph (every layer the target would quantize, with its ranges), each layer
is decided from two measurements (the per-layer rules are in :mod:`.mixed_layers`):

1. **Latency in context** (:mod:`.layer_profile`): the profiler of the runtime that will run
   the graph (ONNX Runtime's, or OpenVINO's performance counters; ONNX Runtime's for runtimes
   without one) times the float and the all-INT8 graph node by node. A layer with a module of
   its own is a candidate when its INT8 time, plus its share of the activation Q/DQ it adds, is
   below its float time. A layer without one (a residual add) is INT8 only when every value it
   quantizes is quantized for an INT8 neighbour anyway, so it adds no Q/DQ of its own.
2. **Sensitivity**: the cosine similarity of the model's outputs to the float model's on the
   build sample and two calibration batches (what the artifact is judged on) with that layer
   alone in INT8. While the candidates together fall below ``accuracy_budget`` (less a fifth of
   its slack, kept for the runtime's own rounding), the most sensitive one goes back to float.

**The half type.** Where the runtime computes faster in a half type on this machine
(:meth:`~embedl_dynamo.runtimes.base.Runtime.rest_precision`: bf16 on OpenVINO on a CPU with
AVX512_BF16 or AMX), the layers left out of INT8 run in it
(:mod:`~embedl_dynamo.graph.rest_precision`; the runtime keeps its own precision-sensitive ops
in fp32), and the float side of step 1 is timed that way: INT8 where it beats the half type,
the half type elsewhere, as TensorRT's INT8 + FP16. Where INT8 with a half rest misses the
budget on the runtime, everything is measured again with an fp32 rest.

Per-node times miss context, so finally the whole graphs compete on that runtime
(:mod:`.mixed_race`): fp32, the float graph in the half type, the per-layer set and INT8
everywhere, each lower one held to the budget there and required to beat fp32 by more than
noise. So ``mixed`` is never slower than ``fp32`` beyond noise, nor than the half type or
``int8`` where they hold the budget. Every decision is recorded per layer (id, precision,
reason, sensitivity, latency) and cached next to the calibration ranges, keyed by the
calibration key, the budget, the runtime and its half type, the library versions and this
package's code: a second process measures nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.rest_precision import with_rest_precision
from embedl_dynamo.onnx.artifact import onnx_artifact
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.quant.int8.calibration_cache import CALIBRATION_NAMESPACE
from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.stage import CalibratedGraph, calibrate_graph
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import cosine, flat_outputs, judging_sample, sample_outputs
from embedl_dynamo.tuning.layer_profile import profile_graph
from embedl_dynamo.tuning.mixed_layers import (
    decide_layers,
    layer_latencies,
)
from embedl_dynamo.tuning.mixed_race import (
    INT8_FP32_REST,
    LayerDecision,
    layer_records,
    race,
    settle,
)
from embedl_dynamo.tuning.precision_form import FormContext

__all__ = ["MixedChoice", "apply_mixed", "apply_mixed_form", "choose_mixed"]

logger = logging.getLogger(__name__)

_FORMAT = 2
_RESERVE = 0.2  # of the budget's slack, kept for the runtime's own rounding


@dataclass
class MixedChoice:
    """The outcome: the graph to build, its quantization report (None: all fp32), one record
    per layer, and ``judged``: where this process held the chosen graph to the budget and timed
    it faster than the float graph as a whole, ``{"runtime": name, "artifact": key}`` (None
    when the decisions came from the cache, the runtime judged nothing, or fp32 was chosen)."""

    model: fx.GraphModule
    report: dict[str, Any] | None
    layers: list[dict[str, Any]]
    judged: dict[str, str] | None = None


def choose_mixed(
    calibrated: CalibratedGraph,
    inputs: Sequence[torch.Tensor],
    batches: Sequence[tuple[torch.Tensor, ...]],
    budget: float,
    *,
    cache_dir: Any = None,
    num_threads: int | None = None,
    artifact_settings: Settings | None = None,
    axes: DynamicAxes | None = None,
    float_model: fx.GraphModule | None = None,
    runtime: type[Runtime] = OnnxRuntime,
) -> MixedChoice:
    """Decide INT8 or fp32 per layer of ``calibrated`` (see the module docstring).

    Args:
        calibrated: the calibrated graph (:func:`~embedl_dynamo.quant.int8.stage.calibrate_graph`).
        inputs: one input per placeholder, for timing.
        batches: calibration batches, for sensitivity (the first few are used).
        budget: the least output cosine to the float model the INT8 set may have.
        cache_dir: where decisions are cached (None: not cached).
        num_threads: ONNX Runtime intra-op threads for timing.
        artifact_settings: when given, whole graphs are timed as the ONNX artifacts the runtime
            deploys (``axes`` dynamic, cached for the runtime to reuse); else static exports.
        axes: the dynamic axes the runtime will export with.
        float_model: the float graph deployed when no INT8 pays (``calibrated.gm`` when
            None); it is the fp32 candidate timed, so a float outcome reuses its artifact.
        runtime: the runtime that will run the graph; latencies are measured on it (on ONNX
            Runtime for a runtime without a profiler here, and the reasons say so).

    Returns:
        The :class:`MixedChoice`; its model is the float model when no INT8 pays.
    """
    # judged on what the artifact will be judged on (the build sample and two calibration
    # batches)
    sample = [tuple(b) for b in judging_sample(list(inputs), batches)]
    measured_on = runtime if runtime.layer_profiler() is not None else OnnxRuntime
    # the runtime's half type for the unquantized layers, where it is measured on itself
    rest = runtime.rest_precision() if measured_on is runtime else None
    key = content_key(
        "mixed",
        calibrated.report["calibration_key"],
        budget,
        num_threads,
        measured_on.name,
        rest,
        library_versions([measured_on, runtime]),
    )
    cache = ArtifactCache(cache_dir, CALIBRATION_NAMESPACE) if cache_dir is not None else None
    cached = _load(cache, key, calibrated)
    judged = None
    if cached is not None:
        int8, records, chosen_rest = cached
        logger.info("mixed precision decisions loaded from the cache")
    else:
        deploy = (artifact_settings, axes, float_model or calibrated.gm)
        int8, records, judged, chosen_rest = _measure(
            calibrated, inputs, sample, budget, num_threads, deploy, measured_on, rest
        )
        if cache is not None:
            document = {"format": _FORMAT, "int8": int8, "rest": chosen_rest, "layers": records}
            try:
                cache.put(
                    key,
                    json.dumps(document, indent=1).encode(),
                    ".json",
                    meta={"kind": "mixed precision decisions"},
                )
            except OSError as exc:
                logger.warning("mixed precision decisions not cached (%s)", exc)
    model, report = float_model or calibrated.gm, None
    if int8:
        model, report = calibrated.build(
            {r["id"]: r["reason"] for r in records if r["id"] not in int8}
        )
    if chosen_rest is not None:
        model = with_rest_precision(model, chosen_rest)
    return MixedChoice(model, report, records, judged)


def _measure(
    calibrated: CalibratedGraph,
    inputs: Sequence[torch.Tensor],
    sample: list[tuple[torch.Tensor, ...]],
    budget: float,
    num_threads: int | None,
    deploy: tuple[Settings | None, DynamicAxes | None, fx.GraphModule | None] = (None,) * 3,
    runtime: type[Runtime] = OnnxRuntime,
    rest: str | None = None,
) -> tuple[list[str], list[dict[str, Any]], dict[str, str] | None, str | None]:
    """(INT8 ids, one record per layer, where the chosen graph was judged: see
    :class:`MixedChoice`, the rest precision of the chosen graph). With ``rest`` (the runtime's
    half type), every lower candidate runs its unquantized layers in it; when the INT8
    candidates fail the budget that way, everything is measured again with them in fp32."""
    where = runtime.name
    settings, axes, float_model = deploy
    float_model = float_model or calibrated.gm

    def in_rest(gm: fx.GraphModule) -> fx.GraphModule:
        return with_rest_precision(gm, rest) if rest else gm

    plain_int8 = calibrated.build()[0]
    every_int8 = in_rest(plain_int8)
    # the all-INT8 graph is keyed and exported once: the artifact the runtime deploys is both
    # profiled here and timed as a whole below
    int8_artifact = None
    if settings is not None:
        int8_artifact = onnx_artifact(every_int8, list(inputs), settings, axes)
    float_times = profile_graph(
        in_rest(calibrated.gm), inputs, num_threads=num_threads, runtime=where
    )
    int8_times = profile_graph(
        every_int8, inputs, num_threads=num_threads, runtime=where, artifact=int8_artifact
    )
    latency = layer_latencies(calibrated, float_times, int8_times)
    # the float graph's outputs on the sample, which every cosine below is taken against:
    # pooled for the per-layer estimates, batch by batch for the race's verdicts
    per_batch = sample_outputs(calibrated.gm, sample)
    reference = flat_outputs(per_batch)
    # the per-layer set is built on fake-quant estimates aiming a fifth of the budget's slack
    # higher (the runtime's integer kernels round a little differently); every candidate is
    # then judged on the runtime at the budget itself
    target = 1.0 - (1.0 - budget) * (1.0 - _RESERVE)
    decided = decide_layers(calibrated, sample, target, latency, reference)
    layers = LayerDecision(*decided, latency, rest=rest or "fp32")
    if set(layers.int8) == set(calibrated.placement.layers):
        full_cosine = layers.cosine
    else:
        full_cosine = cosine(reference, flat_outputs(sample_outputs(every_int8, sample)))
    candidates = {"fp32": float_model}
    if rest:
        candidates[rest] = in_rest(float_model)
    every = list(calibrated.placement.layers)
    if layers.int8 and set(layers.int8) != set(every):
        keep = {i: "mixed: fp32" for i in every if i not in layers.int8}
        candidates["mixed"] = in_rest(calibrated.build(keep)[0])
    if full_cosine >= budget:
        candidates["int8"] = every_int8
        if rest:  # INT8 everywhere with the rest in fp32: `int8` itself, which mixed must match
            candidates[INT8_FP32_REST] = plain_int8
    timed = race(
        candidates,
        inputs,
        (sample, per_batch, budget),
        num_threads=num_threads,
        settings=settings,
        axes=axes,
        runtime=runtime,
        artifacts={"int8": int8_artifact} if int8_artifact is not None else None,
    )
    lower = {"mixed", "int8"}
    if rest and lower & set(timed.refused) and not lower & set(timed.held):
        logger.info("mixed precision on %s: INT8 with %s failed the budget; fp32 rest", where, rest)
        return _measure(calibrated, inputs, sample, budget, num_threads, deploy, runtime)
    best = settle(calibrated, layers, timed, full_cosine, where)
    records = layer_records(calibrated, layers, best, timed, where)
    artifact = timed.held.get(best) if best != "fp32" else None
    judged = {"runtime": where, "artifact": artifact} if artifact else None
    return layers.int8, records, judged, (None if layers.rest == "fp32" else layers.rest)


def _load(
    cache: ArtifactCache | None, key: str, calibrated: CalibratedGraph
) -> tuple[list[str], list[dict[str, Any]], str | None] | None:
    """Cached decisions for ``key``; a corrupt or stale entry is removed and re-measured."""

    def read(document: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]], str | None]:
        int8, records = list(document["int8"]), list(document["layers"])
        known = set(calibrated.placement.layers)
        if document.get("format") != _FORMAT or not set(int8) <= known:
            raise ValueError("it names layers this graph does not have")
        if {r["id"] for r in records} != known:
            raise ValueError("its layers differ from this graph's")
        rest = document.get("rest")
        if rest not in (None, "bf16", "fp16"):
            raise ValueError(f"its rest precision {rest!r} is not a half type")
        return int8, records, rest

    if cache is None:
        return None
    return cache.get_json(key, read, "mixed precision cache entry", "re-measuring")


def apply_mixed(
    result: PipelineResult,
    inputs: Sequence[torch.Tensor],
    quantizer: Quantizer,
    settings: Settings,
    axes: DynamicAxes | None = None,
    runtime: type[Runtime] = OnnxRuntime,
) -> PipelineResult:
    """``result`` (a float pipeline result) with its model replaced by the mixed choice.

    Calibrates on ``settings.calibration_data`` (the example inputs when None: one batch),
    through the calibration cache when it is on, then :func:`choose_mixed`, which times the
    candidates on ``runtime`` as the artifacts it deploys (dynamic ``axes``). The report gets
    ``precision="mixed"``, ``quantization`` (when any layer is INT8) and ``layers``, and
    ``judged`` (:attr:`MixedChoice.judged`) when this process held the chosen graph to the
    budget on ``runtime``: the compile does not judge that artifact on that runtime again.
    """
    data = settings.calibration_data
    if data is None:
        logger.info("precision='mixed' without calibration_data: calibrating on the inputs")
        data = [tuple(inputs)]
    cache_dir = settings.cache_dir if settings.calibration_cache else None
    calibrated = calibrate_graph(
        result.model,
        quantizer,
        data,
        observer=settings.observer,
        cache_dir=cache_dir,
        use_cache=settings.calibration_cache,
        progress=settings.progress,
    )
    batches = data if not callable(data) or isinstance(data, (list, tuple)) else [tuple(inputs)]
    choice = choose_mixed(
        calibrated,
        inputs,
        list(batches),
        settings.accuracy_budget,
        cache_dir=cache_dir,
        num_threads=settings.num_threads,
        artifact_settings=settings,
        axes=axes,
        float_model=result.model,
        runtime=runtime,
    )
    report = dict(result.report, precision="mixed", layers=choice.layers)
    report["quantized"] = choice.report is not None
    if choice.report is None:  # all fp32: the fused graph itself, not the quantizer's prepared one
        return PipelineResult(choice.model, result.plan, report, float_model=result.model)
    report["quantization"] = choice.report
    if choice.judged is not None:
        report["judged"] = choice.judged
    return PipelineResult(choice.model, result.plan, report, float_model=result.model)


def apply_mixed_form(result: PipelineResult, context: FormContext) -> PipelineResult:
    """``mixed``'s form (:data:`~embedl_dynamo.precision.PrecisionForm`): :func:`apply_mixed`
    on the float pipeline ``result``, measured on ``context``'s runtime and axes."""
    return apply_mixed(
        result,
        context.inputs,
        context.backend.quantizer,
        context.settings,
        axes=context.axes,
        runtime=context.runtime_cls,
    )
