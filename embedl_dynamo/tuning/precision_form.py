"""From a frozen graph to the graph its precision builds: the pipeline, then the precision's form.

Both front doors run this one step: ``torch.compile``'s build (:mod:`embedl_dynamo.dynamo.graph_build`)
and :func:`~embedl_dynamo.deploy.export.export`. :func:`transform_for` runs
:func:`~embedl_dynamo.pipeline.run_pipeline`, then the form the precision's registry entry
names (:meth:`~embedl_dynamo.precision.Precision.load_form`): ``mixed``'s per-layer choice
(:func:`~embedl_dynamo.tuning.mixed_precision.apply_mixed_form`), a half precision's typed or
hinted graph on OpenVINO (:func:`~embedl_dynamo.tuning.half_form.apply_half_form`). A form is
chosen by measuring on a runtime, which the caller names: the subgraph's runtime for a compile,
the runtime the file is for for an export.

What only one front door does is a flag here, not a branch there: INT8 that calibrates on the
first real calls (a compile without calibration data) runs the float pipeline and no form, and
a compile chooses the half form when it builds its runtime, which it keeps, rather than here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.pipeline import PipelineResult, run_pipeline
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.settings import Settings

__all__ = ["FormContext", "transform_for"]


@dataclass(frozen=True)
class FormContext:
    """What a precision's form measures with (:data:`~embedl_dynamo.precision.PrecisionForm`).

    Attributes:
        original: the frozen graph before any rewrite, the reference a form is judged against.
        inputs: the example inputs (calibrated, built, judged and timed on).
        backend: the target (its quantizer calibrates ``mixed``).
        settings: the settings at the precision asked for.
        runtime_cls: the runtime the form is measured on, and meant to run on.
        axes: the dynamic axes of the artifacts measured.
        artifact_forms: whether a form that picks among artifacts of one graph (the half form)
            is chosen here; False where the caller chooses it while building the runtime it
            keeps.
    """

    original: fx.GraphModule
    inputs: Sequence[Any]
    backend: Backend
    settings: Settings
    runtime_cls: type[Runtime]
    axes: DynamicAxes | None = None
    artifact_forms: bool = True


def transform_for(
    graph: fx.GraphModule,
    inputs: Sequence[Any],
    backend: Backend,
    settings: Settings,
    runtime_cls: type[Runtime],
    axes: DynamicAxes | None = None,
    *,
    calibrate_later: bool = False,
    artifact_forms: bool = True,
) -> PipelineResult:
    """The pipeline on the frozen ``graph``, then its precision's form measured on
    ``runtime_cls``.

    A precision chosen per layer (``mixed``) runs the float pipeline: its form calibrates and
    decides. Errors propagate; the caller decides whether its graph falls back.

    Args:
        graph: the frozen graph (also the reference the form is judged against).
        inputs: one real input per placeholder.
        backend: the target whose patterns and quantizer are used.
        settings: the settings; ``precision`` picks the stage and the form.
        runtime_cls: the runtime the form is measured on.
        axes: the dynamic axes of the artifacts the form measures.
        calibrate_later: the caller calibrates on the first real calls (a compile's INT8
            without calibration data): the float pipeline runs, and no form.
        artifact_forms: see :attr:`FormContext.artifact_forms`.

    Returns:
        The :class:`~embedl_dynamo.pipeline.PipelineResult` in the form chosen.
    """
    precision = settings.precision
    float_first = calibrate_later or precision.per_layer
    result = run_pipeline(
        graph, inputs, backend, settings.float_copy() if float_first else settings
    )
    form = None if calibrate_later else precision.load_form()
    if form is None:
        return result
    context = FormContext(graph, inputs, backend, settings, runtime_cls, axes, artifact_forms)
    return form(result, context)
