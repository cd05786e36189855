"""The graph pipeline shared by ``torch.compile`` and the export helper.

``run_pipeline`` takes a *frozen* torch-level graph (weights are ``get_attr`` constants, see
:mod:`embedl_dynamo.graph.freeze`) and runs, in order:

1. canonicalisation and the Backend's conversions to a fixpoint, then its fusions, planned
   longest first (:func:`~embedl_dynamo.rewrite.engine.plan_transformation` /
   :func:`~embedl_dynamo.rewrite.engine.apply_transformation_plan`);
2. the quantization step (:func:`_quantize_step`), only when ``settings.quantize`` is set.

It knows nothing about Dynamo or runtimes, so any caller that has a frozen graph can use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.rewrite.plan import TransformationPlan
from embedl_dynamo.settings import Settings

__all__ = ["PipelineResult", "run_pipeline"]

logger = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    """What :func:`run_pipeline` returns.

    Attributes:
        model: the transformed (and, if asked, quantized) GraphModule.
        plan: the transformation plan (``print(plan)`` shows every match and why it was or was
            not applied).
        report: counts from the plan plus ``quantized`` and per-step timings in seconds.
        float_model: the transformed model before quantization (same as ``model`` for float).
    """

    model: fx.GraphModule
    plan: TransformationPlan
    report: dict[str, Any] = field(default_factory=dict)
    float_model: fx.GraphModule | None = None


def _quantize_step(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Backend, settings: Settings
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """INT8: delegate to :func:`embedl_dynamo.quant.quantize_for_pipeline`.

    Returns:
        The quantized GraphModule and the quantization report (may be empty).
    """
    from embedl_dynamo import quant

    quantize_for_pipeline = getattr(quant, "quantize_for_pipeline", None)
    if quantize_for_pipeline is None:
        raise NotImplementedError(
            "quantize='int8' needs embedl_dynamo.quant.quantize_for_pipeline(gm, example_inputs, "
            "backend, settings), which this installation does not provide yet"
        )
    result = quantize_for_pipeline(gm, example_inputs, backend, settings)
    if isinstance(result, fx.GraphModule):
        return result, {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], fx.GraphModule):
        return result[0], dict(result[1] or {})
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], fx.GraphModule)
        and isinstance(result[1], dict)
    ):
        return result[0], dict(result[1])  # quant.quantize_for_pipeline: (model, report)
    model = getattr(result, "model", None)
    if not isinstance(model, fx.GraphModule):
        raise TypeError(
            f"quantize_for_pipeline returned {type(result).__name__}; expected a GraphModule, "
            "a (GraphModule, report) pair or an object with a .model GraphModule"
        )
    return model, dict(getattr(result, "report", {}) or {})


def run_pipeline(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend,
    settings: Settings | None = None,
) -> PipelineResult:
    """Canonicalise, convert, fuse and (optionally) quantize a frozen graph.

    Args:
        gm: the frozen graph; not modified.
        example_inputs: one real input per placeholder (used for shapes and calibration).
        backend: the target whose patterns are used.
        settings: the settings (defaults when None); only ``quantize`` and the INT8 options
            are read here.

    Returns:
        A :class:`PipelineResult`.
    """
    settings = settings if settings is not None else Settings()
    start = time.perf_counter()
    patterns = [*backend.conversion_patterns, *backend.fusion_patterns]
    plan = plan_transformation(gm, patterns, args=list(example_inputs))
    result = apply_transformation_plan(plan)
    report: dict[str, Any] = dict(result.report)
    report["backend"] = backend.name
    report["transform_s"] = round(time.perf_counter() - start, 4)
    model = float_model = result.model
    report["quantized"] = False
    if settings.quantize is not None:
        start = time.perf_counter()
        model, quant_report = _quantize_step(float_model, example_inputs, backend, settings)
        report["quantized"] = True
        report["quantization"] = quant_report
        report["quantize_s"] = round(time.perf_counter() - start, 4)
    logger.debug(
        "pipeline on backend %s: %s fusions/conversions applied in %.3f s",
        backend.name,
        report.get("applied_count"),
        report["transform_s"],
    )
    return PipelineResult(model=model, plan=plan, report=report, float_model=float_model)
