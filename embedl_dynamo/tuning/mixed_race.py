"""The whole-graph half of ``precision="mixed"``: the candidates race on the runtime.

Per-node times miss context (a float stem convolution leaves its max pool in float too), so the
whole graphs within the budget compete on the runtime, timed round-robin: fp32; where the
runtime has a rest precision (:meth:`~embedl_dynamo.runtimes.base.Runtime.rest_precision`:
bf16 on OpenVINO on a CPU with AVX512_BF16 or AMX) the float graph in it; the per-layer INT8
set; and INT8 everywhere, the last two with their unquantized layers in the rest precision
where there is one (and then INT8 everywhere with an fp32 rest too, since the half type does
not pay on every model). Each lower candidate is judged on the runtime (its integer kernels are
what will run) against ``accuracy_budget``, batch by batch, and must beat fp32 by more than
noise (:func:`.timer.fastest_of`); fp32 itself must answer as its graph does on the sample
(the float rule), or nothing races against a wrong baseline. :func:`settle` picks the winner
and :func:`layer_records` says, per layer, what runs and why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from embedl_dynamo.quant.int8.stage import CalibratedGraph
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.tuning.judge import check_float_sample, sample_outputs, worst_cosine
from embedl_dynamo.tuning.layer_profile import time_graphs
from embedl_dynamo.tuning.timer import fastest_of

__all__ = ["INT8_FP32_REST", "LayerDecision", "Race", "layer_records", "race", "settle"]

# the candidate INT8 everywhere with the rest in fp32 (what ``precision="int8"`` deploys), raced
# beside the one with the runtime's half rest: the half type does not pay on every model
INT8_FP32_REST = "int8 (fp32 rest)"

logger = logging.getLogger(__name__)


@dataclass
class LayerDecision:
    """The per-layer decision (:func:`~.mixed_layers.decide_layers`) and its latencies; ``rest``
    is the precision the layers left out of INT8 run in (``fp32``, or the runtime's half)."""

    int8: list[str]
    reasons: dict[str, str]
    sensitivity: dict[str, float]
    cosine: float  # the INT8 set's output cosine
    latency: dict[str, tuple[float, float] | None]
    rest: str = "fp32"


@dataclass
class Race:
    """The whole graphs timed on the runtime: ms by name (fp32 first), the cosines of those the
    runtime got wrong, the artifact key of each that held the budget there, and what the
    runtime computes each module in, per candidate (where it says)."""

    timings: dict[str, float] = field(default_factory=dict)
    refused: dict[str, float] = field(default_factory=dict)
    held: dict[str, str | None] = field(default_factory=dict)
    precisions: dict[str, dict[str, str]] = field(default_factory=dict)

    def shown(self) -> str:
        """The timings, for the reasons and the log."""
        return ", ".join(f"{name} {ms:.3f} ms" for name, ms in self.timings.items())


def race(
    candidates: dict[str, fx.GraphModule],
    inputs: Sequence[torch.Tensor],
    judging: tuple[list[tuple[torch.Tensor, ...]], list[list[torch.Tensor]], float],
    **timing: Any,
) -> Race:
    """Build the candidates on the runtime, judge each lower one there against the budget (a
    runtime can get a Q/DQ subset wrong that another runs right), fp32 by the float rule, and
    time those that hold (:func:`~.layer_profile.time_graphs`, given ``timing``). ``judging``
    is the sample, the float graph's flat outputs on each of its batches and the budget; a
    batch's cosine counts alone (:func:`~.judge.worst_cosine`), as in the compile's verdict.

    Raises:
        OutputMismatchError: the fp32 candidate's artifact answers otherwise than its graph on
            the sample (the float rule, :func:`~.judge.check_float_sample`): nothing races
            against a wrong baseline, and it is never served.
    """
    sample, reference, budget = judging
    result = Race()

    def judge(name: str, built: Runtime) -> bool:
        result.precisions[name] = built.module_precisions()
        if name == "fp32":
            check_float_sample(built, candidates[name], sample)
            return True
        value = worst_cosine(
            reference, sample_outputs(built.infer, sample), f"the {name} candidate"
        )
        if value < budget:
            result.refused[name] = value
        else:
            result.held[name] = built.key()
        return value >= budget

    result.timings = time_graphs(candidates, inputs, judge=judge, **timing)
    return result


def settle(
    calibrated: CalibratedGraph,
    layers: LayerDecision,
    timed: Race,
    full_cosine: float,
    where: str,
) -> str:
    """The fastest whole graph (:func:`~.timer.fastest_of`: a lower precision must beat fp32 by
    more than noise); ``layers`` updated to it, with the reasons of layers that leave INT8."""
    every = list(calibrated.placement.layers)
    if timed.refused:
        logger.info(
            "mixed precision on %s: refused on the runtime: %s",
            where,
            ", ".join(f"{n} (cosine {c:.4f})" for n, c in timed.refused.items()),
        )
    if "mixed" in timed.refused and "int8" in timed.timings:
        # the per-layer set failed; INT8 everywhere holds
        layers.int8, layers.cosine = every, full_cosine
    lower = {"mixed", "int8", INT8_FP32_REST, layers.rest} - {"fp32"}
    best = fastest_of(timed.timings, must_beat=lower)
    timing = timed.shown()
    if best in ("fp32", layers.rest) and layers.int8:
        if timed.refused and "int8" not in timed.timings:
            why = ", ".join(f"{n}: cosine {c:.4f}" for n, c in timed.refused.items())
            reason = f"the INT8 set failed the budget on {where} ({why})"
        else:
            reason = f"the INT8 set was not faster as a whole ({timing})"
        layers.reasons.update(dict.fromkeys(layers.int8, reason))
        layers.int8 = []
    elif best in ("int8", INT8_FP32_REST):
        layers.int8, layers.cosine = every, full_cosine
    if best in ("fp32", INT8_FP32_REST):
        layers.rest = "fp32"
    logger.info("mixed precision on %s, whole graphs: %s; chose %s", where, timing, best)
    return best


def layer_records(
    calibrated: CalibratedGraph,
    layers: LayerDecision,
    best: str,
    timed: Race,
    where: str,
) -> list[dict[str, Any]]:
    """One record per layer: id, precision, reason, sensitivity and latencies. A layer left out
    of INT8 runs in ``layers.rest``, or in fp32 where the runtime says it keeps it there."""
    timing = timed.shown()
    if best in ("int8", INT8_FP32_REST):
        int8_reason = (
            f"INT8 everywhere was fastest as a whole on {where} ({timing}); "
            f"output cosine {layers.cosine:.4f}, within the budget"
        )
    else:
        int8_reason = (
            f"faster in INT8 on {where}; output cosine {layers.cosine:.4f} with "
            "the INT8 set, within the budget"
        )
    ran = timed.precisions.get(best, {})
    records = []
    for ident, points in calibrated.placement.layers.items():
        times = layers.latency[ident]
        is_int8 = ident in layers.int8
        precision, reason = (
            ("int8", int8_reason) if is_int8 else (layers.rest, layers.reasons[ident])
        )
        if not is_int8 and layers.rest != "fp32":
            if ran.get(points.module or "") == "fp32":
                precision = "fp32"
                reason = f"{reason}; {where} keeps it in fp32 under its {layers.rest} hint"
            else:
                reason = f"{reason}; {layers.rest} on {where} was faster than fp32 ({timing})"
        records.append(
            {
                "id": ident,
                "precision": precision,
                "reason": reason,
                "sensitivity": layers.sensitivity.get(ident),
                "latency_ms": None if times is None else round(times[1 if is_int8 else 0], 4),
                # the float side is timed in the rest precision (fp32, or the runtime's half)
                f"latency_{layers.rest}_ms": None if times is None else round(times[0], 4),
                "latency_int8_ms": None if times is None else round(times[1], 4),
            }
        )
    logger.info("mixed precision: %d of %d layers INT8", len(layers.int8), len(records))
    return records
