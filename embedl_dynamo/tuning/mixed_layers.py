"""The per-layer half of ``precision="mixed"``: which layers go INT8 (see :mod:`.mixed_precision`).

A layer with a module of its own is a candidate when its INT8 time in context, plus its share
of the activation Q/DQ it adds, is below its float time (:func:`layer_latencies`); a layer
without one (a residual add) rides along only when every value it quantizes is quantized for an
INT8 neighbour anyway (:func:`free_riders`). While the candidates together miss the budget,
the most sensitive (output cosine with that layer alone in INT8) goes back to float
(:func:`decide_layers`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from embedl_dynamo.quant.int8.stage import CalibratedGraph
from embedl_dynamo.tuning.judge import cosine, flat_outputs, format_cosine, sample_outputs
from embedl_dynamo.tuning.layer_profile import LayerTimes

__all__ = [
    "decide_layers",
    "free_riders",
    "layer_latencies",
    "set_cosine",
]


def layer_latencies(
    calibrated: CalibratedGraph, float_times: LayerTimes, int8_times: LayerTimes
) -> dict[str, tuple[float, float] | None]:
    """Layer id -> (float ms, INT8 ms incl. its share of Q/DQ), None where not attributable."""
    sharing = Counter(a for p in calibrated.placement.layers.values() for a in set(p.activations))
    result: dict[str, tuple[float, float] | None] = {}
    for ident, points in calibrated.placement.layers.items():
        float_ms = float_times.module_ms(points.module) if points.module else None
        int8_ms = int8_times.module_ms(points.module) if points.module else None
        if float_ms is None or int8_ms is None:
            result[ident] = None
            continue
        qdq = sum(int8_times.quantizer_ms(a) / sharing[a] for a in set(points.activations))
        result[ident] = (float_ms, int8_ms + qdq)
    return result


def decide_layers(
    calibrated: CalibratedGraph,
    batches: Sequence[tuple[torch.Tensor, ...]],
    budget: float,
    latency: dict[str, tuple[float, float] | None],
    reference: Sequence[torch.Tensor],
) -> tuple[list[str], dict[str, str], dict[str, float], float]:
    """(INT8 ids, float id -> reason, id -> sensitivity, the INT8 set's output cosine).

    ``reference`` is the float graph's outputs on ``batches`` (flat, as :func:`.judge.flat_outputs`). Per-layer
    sensitivity (one forward pass over the sample per layer) is measured only when the
    candidates together miss the budget, which is when it decides something.
    """
    layers = list(calibrated.placement.layers)
    reasons: dict[str, str] = {}
    sensitivity: dict[str, float] = {}
    candidates = []
    for ident in layers:
        times = latency[ident]
        if times is None:
            continue
        float_ms, int8_ms = times
        if int8_ms < float_ms:
            candidates.append(ident)
        else:
            reasons[ident] = f"int8 not faster here ({int8_ms:.3f} ms with Q/DQ vs {float_ms:.3f})"

    def cosine_with(int8: list[str]) -> float:
        return set_cosine(calibrated, batches, int8, reference)

    chosen = list(candidates)
    cosine = cosine_with(chosen + free_riders(calibrated, chosen, latency)) if chosen else 1.0
    if cosine < budget:  # only now is each layer's sensitivity worth its forward passes
        for ident in candidates:
            sensitivity[ident] = cosine_with([ident])
        chosen.sort(key=lambda i: sensitivity[i])  # most sensitive first
    while chosen and cosine < budget:
        dropped = chosen.pop(0)
        reasons[dropped] = (
            f"too sensitive: alone in INT8 its output cosine is {sensitivity[dropped]:.4f}; "
            f"the INT8 set reached {format_cosine(cosine, budget)} < {budget:.4g} "
            "(accuracy_budget, less a reserve "
            "for the runtime's rounding)"
        )
        if chosen:
            cosine = cosine_with(chosen + free_riders(calibrated, chosen, latency))
    int8 = chosen + free_riders(calibrated, chosen, latency) if chosen else []
    for ident in layers:
        if ident not in int8 and ident not in reasons:
            reasons[ident] = "adds Q/DQ no INT8 neighbour needs (latency not attributable)"
    return int8, reasons, sensitivity, cosine


def set_cosine(
    calibrated: CalibratedGraph,
    sample: Sequence[tuple[torch.Tensor, ...]],
    int8: list[str],
    reference: Sequence[torch.Tensor],
) -> float:
    """Output cosine to the float graph (``reference``: its outputs) with exactly ``int8`` INT8."""
    keep = {i: "mixed: fp32" for i in calibrated.placement.layers if i not in int8}
    return cosine(reference, flat_outputs(sample_outputs(calibrated.build(keep)[0], sample)))


def free_riders(
    calibrated: CalibratedGraph, chosen: list[str], latency: dict[str, Any]
) -> list[str]:
    """Layers without a timing of their own whose every Q/DQ point an INT8 layer already has."""
    covered = {a for i in chosen for a in calibrated.placement.layers[i].activations}
    return [
        ident
        for ident, points in calibrated.placement.layers.items()
        if latency[ident] is None and points.activations and set(points.activations) <= covered
    ]
