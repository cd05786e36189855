"""``precision="mixed"``: INT8 per layer where it is faster on the runtime, within the budget.

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

Per-node times miss context (a float stem convolution leaves its max pool in float too), so
finally the whole graphs within the budget compete on that runtime, timed round-robin: fp32,
the per-layer set, and INT8 everywhere; a lower precision must beat fp32 by more than noise
(:func:`.timer.fastest_of`). So ``mixed`` is never slower than ``fp32`` beyond noise, nor than
``int8`` where ``int8`` holds the budget. Every decision is recorded per layer (id, precision, reason, sensitivity,
latency) and cached next to the calibration ranges, keyed by the calibration key, the budget,
the runtime, the library versions and this package's code: a second process measures nothing.
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
from embedl_dynamo.onnx.artifact import code_fingerprint, onnx_artifact
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.quant.cache import CALIBRATION_NAMESPACE
from embedl_dynamo.quant.quantizer import Quantizer
from embedl_dynamo.quant.stage import CalibratedGraph, calibrate_graph
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import cosine, flat_outputs, judging_sample, sample_outputs
from embedl_dynamo.tuning.layer_profile import profile_graph, time_graphs
from embedl_dynamo.tuning.mixed_layers import (
    decide_layers,
    layer_latencies,
)
from embedl_dynamo.tuning.timer import fastest_of

__all__ = ["MixedChoice", "apply_mixed", "choose_mixed"]

logger = logging.getLogger(__name__)

_FORMAT = 1
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
        calibrated: the calibrated graph (:func:`~embedl_dynamo.quant.stage.calibrate_graph`).
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
    key = content_key(
        "mixed",
        calibrated.report["calibration_key"],
        budget,
        num_threads,
        measured_on.name,
        library_versions([measured_on, runtime]),
        code_fingerprint(),
    )
    cache = ArtifactCache(cache_dir, CALIBRATION_NAMESPACE) if cache_dir is not None else None
    cached = _load(cache, key, calibrated)
    judged = None
    if cached is not None:
        int8, records = cached
        logger.info("mixed precision decisions loaded from the cache")
    else:
        deploy = (artifact_settings, axes, float_model or calibrated.gm)
        int8, records, judged = _measure(
            calibrated, inputs, sample, budget, num_threads, deploy, measured_on
        )
        if cache is not None:
            document = {"format": _FORMAT, "int8": int8, "layers": records}
            try:
                cache.put(key, json.dumps(document, indent=1).encode(), ".json",
                          meta={"kind": "mixed precision decisions"})  # fmt: skip
            except OSError as exc:
                logger.warning("mixed precision decisions not cached (%s)", exc)
    if not int8:
        return MixedChoice(float_model or calibrated.gm, None, records)
    keep = {r["id"]: r["reason"] for r in records if r["precision"] == "fp32"}
    model, report = calibrated.build(keep)
    return MixedChoice(model, report, records, judged)


@dataclass
class _Layers:
    """The per-layer decision (:func:`~.mixed_layers.decide_layers`) and its latencies."""

    int8: list[str]
    reasons: dict[str, str]
    sensitivity: dict[str, float]
    cosine: float  # the INT8 set's output cosine
    latency: dict[str, tuple[float, float] | None]


@dataclass
class _Race:
    """The whole graphs timed on the runtime: ms by name (fp32 first), the cosines of those the
    runtime got wrong, and the artifact key of each that held the budget there."""

    timings: dict[str, float]
    refused: dict[str, float]
    held: dict[str, str | None]

    def shown(self) -> str:
        """The timings, for the reasons and the log."""
        return ", ".join(f"{name} {ms:.3f} ms" for name, ms in self.timings.items())


def _measure(
    calibrated: CalibratedGraph,
    inputs: Sequence[torch.Tensor],
    sample: list[tuple[torch.Tensor, ...]],
    budget: float,
    num_threads: int | None,
    deploy: tuple[Settings | None, DynamicAxes | None, fx.GraphModule | None] = (None,) * 3,
    runtime: type[Runtime] = OnnxRuntime,
) -> tuple[list[str], list[dict[str, Any]], dict[str, str] | None]:
    """(INT8 ids, one record per layer, where the chosen graph was judged: see
    :class:`MixedChoice`)."""
    where = runtime.name
    settings, axes, float_model = deploy
    every_int8 = calibrated.build()[0]
    # the all-INT8 graph is keyed and exported once: the artifact the runtime deploys is both
    # profiled here and timed as a whole below
    int8_artifact = None
    if settings is not None:
        int8_artifact = onnx_artifact(every_int8, list(inputs), settings, axes)
    float_times = profile_graph(calibrated.gm, inputs, num_threads=num_threads, runtime=where)
    int8_times = profile_graph(
        every_int8, inputs, num_threads=num_threads, runtime=where, artifact=int8_artifact
    )
    latency = layer_latencies(calibrated, float_times, int8_times)
    # the float graph's outputs on the sample, which every cosine below is taken against
    reference = flat_outputs(sample_outputs(calibrated.gm, sample))
    # the per-layer set is built on fake-quant estimates aiming a fifth of the budget's slack
    # higher (the runtime's integer kernels round a little differently); every candidate is
    # then judged on the runtime at the budget itself
    target = 1.0 - (1.0 - budget) * (1.0 - _RESERVE)
    layers = _Layers(*decide_layers(calibrated, sample, target, latency, reference), latency)
    if set(layers.int8) == set(calibrated.placement.layers):
        full_cosine = layers.cosine
    else:
        full_cosine = cosine(reference, flat_outputs(sample_outputs(every_int8, sample)))
    candidates = _candidates(
        calibrated, layers.int8, float_model or calibrated.gm, every_int8, full_cosine >= budget
    )
    race = _race(
        candidates, inputs, (sample, reference, budget),
        num_threads=num_threads, settings=settings, axes=axes, runtime=runtime,
        artifacts={"int8": int8_artifact} if int8_artifact is not None else None,
    )  # fmt: skip
    best = _settle(calibrated, layers, race, full_cosine, where)
    records = _records(calibrated, layers, best, race.shown(), where)
    artifact = race.held.get(best) if best != "fp32" else None
    judged = {"runtime": where, "artifact": artifact} if artifact else None
    return layers.int8, records, judged


def _candidates(
    calibrated: CalibratedGraph,
    int8: list[str],
    float_model: fx.GraphModule,
    every_int8: fx.GraphModule,
    int8_holds: bool,
) -> dict[str, fx.GraphModule]:
    """The whole graphs that compete: fp32, the per-layer set (when it is neither none nor every
    layer) and INT8 everywhere (when it holds the budget). Per-node times miss context (a float
    stem conv leaves its max pool float too), hence the whole graphs."""
    every = list(calibrated.placement.layers)
    candidates = {"fp32": float_model}
    if int8 and set(int8) != set(every):
        keep = {i: "mixed: fp32" for i in every if i not in int8}
        candidates["mixed"] = calibrated.build(keep)[0]
    if int8_holds:
        candidates["int8"] = every_int8
    return candidates


def _race(
    candidates: dict[str, fx.GraphModule],
    inputs: Sequence[torch.Tensor],
    judging: tuple[list[tuple[torch.Tensor, ...]], torch.Tensor, float],
    **timing: Any,
) -> _Race:
    """Build the candidates on the runtime, judge each lower one there against the budget (its
    integer kernels are what will run, and a runtime can get a Q/DQ subset wrong that another
    runs right) and time those that hold (:func:`~.layer_profile.time_graphs`, given
    ``timing``). ``judging`` is the sample, the float graph's outputs on it and the budget."""
    sample, reference, budget = judging
    race = _Race({}, {}, {})

    def judge(name: str, built: Runtime) -> bool:
        if name == "fp32":
            return True
        value = cosine(reference, flat_outputs(sample_outputs(built.infer, sample)))
        if value < budget:
            race.refused[name] = value
        else:
            race.held[name] = built.key()
        return value >= budget

    race.timings = time_graphs(candidates, inputs, judge=judge, **timing)
    return race


def _settle(
    calibrated: CalibratedGraph, layers: _Layers, race: _Race, full_cosine: float, where: str
) -> str:
    """The fastest whole graph (:func:`~.timer.fastest_of`: a lower precision must beat fp32 by
    more than noise); ``layers`` updated to it, with the reasons of layers that go back to fp32.
    """
    every = list(calibrated.placement.layers)
    if race.refused:
        logger.info("mixed precision on %s: refused on the runtime: %s", where,
                    ", ".join(f"{n} (cosine {c:.4f})" for n, c in race.refused.items()))  # fmt: skip
    if "mixed" in race.refused and "int8" in race.timings:
        # the per-layer set failed; INT8 everywhere holds
        layers.int8, layers.cosine = every, full_cosine
    best = fastest_of(race.timings, lower_precision={"mixed", "int8"})
    timing = race.shown()
    if best == "fp32" and layers.int8 and race.refused and "int8" not in race.timings:
        why = ", ".join(f"{n}: cosine {c:.4f}" for n, c in race.refused.items())
        reason = f"the INT8 set failed the budget on {where} ({why})"
        layers.reasons.update(dict.fromkeys(layers.int8, reason))
        layers.int8 = []
    elif best == "fp32" and layers.int8:
        reason = f"the INT8 set was not faster as a whole ({timing})"
        layers.reasons.update(dict.fromkeys(layers.int8, reason))
        layers.int8 = []
    elif best == "int8":
        layers.int8, layers.cosine = every, full_cosine
    logger.info("mixed precision on %s, whole graphs: %s; chose %s", where, timing, best)
    return best


def _records(
    calibrated: CalibratedGraph, layers: _Layers, best: str, timing: str, where: str
) -> list[dict[str, Any]]:
    """One record per layer: id, precision, reason, sensitivity and latencies."""
    if best == "int8":
        int8_reason = (
            f"INT8 everywhere was fastest as a whole on {where} ({timing}); "
            f"output cosine {layers.cosine:.4f}, within the budget"
        )
    else:
        int8_reason = (
            f"faster in INT8 on {where}; output cosine {layers.cosine:.4f} with "
            "the INT8 set, within the budget"
        )
    records = []
    for ident in calibrated.placement.layers:
        times = layers.latency[ident]
        is_int8 = ident in layers.int8
        records.append(
            {
                "id": ident,
                "precision": "int8" if is_int8 else "fp32",
                "reason": int8_reason if is_int8 else layers.reasons[ident],
                "sensitivity": layers.sensitivity.get(ident),
                "latency_ms": None if times is None else round(times[1 if is_int8 else 0], 4),
                "latency_fp32_ms": None if times is None else round(times[0], 4),
                "latency_int8_ms": None if times is None else round(times[1], 4),
            }
        )
    logger.info("mixed precision: %d of %d layers INT8", len(layers.int8), len(records))
    return records


def _load(
    cache: ArtifactCache | None, key: str, calibrated: CalibratedGraph
) -> tuple[list[str], list[dict[str, Any]]] | None:
    """Cached decisions for ``key``; a corrupt or stale entry is removed and re-measured."""

    def read(document: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
        int8, records = list(document["int8"]), list(document["layers"])
        known = set(calibrated.placement.layers)
        if document.get("format") != _FORMAT or not set(int8) <= known:
            raise ValueError("it names layers this graph does not have")
        if {r["id"] for r in records} != known:
            raise ValueError("its layers differ from this graph's")
        return int8, records

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
        result.model, quantizer, data, observer=settings.observer, cache_dir=cache_dir,
        use_cache=settings.calibration_cache, progress=settings.progress,
    )  # fmt: skip
    batches = data if not callable(data) or isinstance(data, (list, tuple)) else [tuple(inputs)]
    choice = choose_mixed(
        calibrated, inputs, list(batches), settings.accuracy_budget,
        cache_dir=cache_dir, num_threads=settings.num_threads, artifact_settings=settings,
        axes=axes, float_model=result.model, runtime=runtime,
    )  # fmt: skip
    report = dict(result.report, precision="mixed", layers=choice.layers)
    report["quantized"] = choice.report is not None
    if choice.report is None:  # all fp32: the fused graph itself, not the quantizer's prepared one
        return PipelineResult(choice.model, result.plan, report, float_model=result.model)
    report["quantization"] = choice.report
    if choice.judged is not None:
        report["judged"] = choice.judged
    return PipelineResult(choice.model, result.plan, report, float_model=result.model)
