"""Which graph a half precision (``bf16``, ``fp16``) runs as on OpenVINO: the one decision.

Two forms compute the same half precision, and which is faster depends on the model:

* the **typed graph** (:func:`~embedl_dynamo.quant.half.stage.cast_graph`): matmul-class
  layers in the half type, Cast nodes around every fp32 island (norms, reductions,
  squeeze-excite pooling, outputs). TensorRT's strongly typed networks need this form, and
  every other runtime keeps it;
* the **f32 graph with the hint**: the float graph whose file asks for the half type
  (:mod:`~embedl_dynamo.graph.rest_precision`), compiled with ``INFERENCE_PRECISION_HINT`` set
  to it, so OpenVINO's CPU plugin keeps its own precision-sensitive ops in f32 and pays no
  casts between them; what OpenVINO's own users get by default on a CPU with bf16. Offered
  only where the CPU computes in the half type (else the hint would run f32).

:func:`choose_half_form` builds both, holds each to ``accuracy_budget`` on the build sample,
times them (:func:`~embedl_dynamo.tuning.runtime_choice.fastest`, so the decision is cached
like every runtime decision: keyed by the graphs' architecture, the threads, the library
versions and the CPU) and keeps the faster. Its note says which form runs and by how much it
was faster, e.g. ``bf16 on openvino: f32 graph + bf16 hint (timed 0.60x the typed graph)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import fx

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.rest_precision import with_rest_precision
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.precision import Precision
from embedl_dynamo.runtimes.base import ArtifactJudge, Runtime
from embedl_dynamo.runtimes.openvino.compile import computes_in, half_hint
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.runtimes.reference import graph_outputs
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import FLOAT_RTOL, check_precision_outputs, judge_against
from embedl_dynamo.tuning.precision_form import FormContext
from embedl_dynamo.tuning.runtime_choice import RunOption, RuntimeChoice, fastest

__all__ = [
    "HINT",
    "TYPED",
    "apply_half_form",
    "choose_half_form",
    "half_form_note",
    "half_form_options",
]

TYPED = "typed graph"
HINT = "f32 graph + hint"


def _label(runtime: type[Runtime], form: str, precision: Precision) -> str:
    hint = half_hint(precision.half_dtype) or precision.name
    words = f"typed {precision.name} graph" if form == TYPED else f"f32 graph + {hint} hint"
    return f"{runtime.name}: {words}"


def half_form_options(
    model: fx.GraphModule,
    float_model: fx.GraphModule | None,
    runtime_cls: type[Runtime],
    precision: Precision,
) -> list[RunOption] | None:
    """The two forms of a half-precision graph on OpenVINO, typed first (ties keep it); the
    typed one alone where the CPU does not compute in the half type; None where there is one
    form only (not a half precision, no float graph, not OpenVINO)."""
    if precision.half_dtype is None or float_model is None:
        return None
    hint = half_hint(precision.half_dtype)
    if hint is None or not issubclass(runtime_cls, OpenVINORuntime):
        return None
    typed = RunOption(_label(runtime_cls, TYPED, precision), runtime_cls, model, True)
    if not computes_in(hint):
        return [typed]
    hinted = with_rest_precision(float_model, precision.name)
    return [typed, RunOption(_label(runtime_cls, HINT, precision), runtime_cls, hinted, True)]


def _within_budget(
    original: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    lower: Sequence[fx.GraphModule],
    budget: float,
) -> ArtifactJudge:
    """:func:`~embedl_dynamo.tuning.judge.judge_against`, with each form's artifact also held
    to ``budget`` against ``original`` on the build sample: a form that misses it does not
    build, so the other one runs."""
    base = judge_against(original, inputs, lower)
    expected: list[list[torch.Tensor]] = []

    def judge(
        gm: fx.GraphModule,
        own: Callable[[], Sequence[torch.Tensor]],
        actual: Sequence[torch.Tensor],
        what: str,
        rtol: float = FLOAT_RTOL,
    ) -> None:
        base(gm, own, actual, what, rtol)
        if not expected:
            expected.append(list(graph_outputs(original, inputs)))
        check_precision_outputs([expected[0]], [list(actual)], budget, what)

    return judge


def half_form_note(choice: RuntimeChoice, precision: Precision) -> str:
    """The report line of the decision: ``"bf16 on openvino: f32 graph + bf16 hint (timed
    0.60x the typed graph)"``; the cached decision, a CPU without the half type and a form that
    did not build are said."""
    runtime, form = choice.option.label.split(": ", 1)
    hint = half_hint(precision.half_dtype) or precision.name
    other = "f32 graph + hint" if form.startswith("typed") else "typed graph"
    if len(choice.timings) > 1:
        loser = next(label for label in choice.timings if label != choice.option.label)
        ratio = choice.timings[choice.option.label] / choice.timings[loser]
        why = f"timed {ratio:.2f}x the {other}"
    elif choice.from_cache:
        why = "cached decision for this architecture on this CPU; not timed"
    elif not computes_in(hint):
        why = f"this CPU does not compute in {hint}: the f32 graph + hint would run f32"
    else:
        why = f"the {other} did not build or missed accuracy_budget"
    return f"{precision.name} on {runtime}: {form} ({why})"


def choose_half_form(
    model: fx.GraphModule,
    float_model: fx.GraphModule | None,
    runtime_cls: type[Runtime],
    original: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
) -> RuntimeChoice | None:
    """The faster form of the half-precision graph ``model`` on ``runtime_cls``, within
    ``accuracy_budget``, built and active, its note from :func:`half_form_note`; None where
    there is one form only (:func:`half_form_options`).

    Args:
        model: the typed graph (the half precision's stage output).
        float_model: the float graph it was cast from.
        runtime_cls: the runtime chosen for the subgraph.
        original: the graph before any rewrite (the reference).
        inputs: the example inputs (built, judged and timed on).
        settings: the settings (precision, budget, cache, threads).
        axes: the dynamic axes of the artifacts.

    Raises:
        Exception: what the last form raised, when neither builds within the budget.
    """
    options = half_form_options(model, float_model, runtime_cls, settings.precision)
    if options is None:
        return None
    lower = [o.model for o in options]
    judge = _within_budget(original, inputs, lower, settings.accuracy_budget)
    choice = fastest(options, inputs, settings, axes, judge)
    note = half_form_note(choice, settings.precision)
    return dataclasses.replace(choice, note=note)


def apply_half_form(result: PipelineResult, context: FormContext) -> PipelineResult:
    """A half precision's form (:data:`~embedl_dynamo.precision.PrecisionForm`): ``result``
    in the form :func:`choose_half_form` found faster on ``context``'s runtime within the
    budget (the typed graph, or the float graph whose file asks for the half type), its
    report's ``half_form`` saying which and why; ``result`` as it is where there is one form
    only, or where ``context`` leaves the artifact's form to the caller's build."""
    if not context.artifact_forms:
        return result
    choice = choose_half_form(
        result.model,
        result.float_model,
        context.runtime_cls,
        context.original,
        list(context.inputs),
        context.settings,
        context.axes,
    )
    if choice is None:
        return result
    choice.runtime.deactivate()  # what is kept is the graph of the form chosen
    report = dict(result.report, half_form=choice.note)
    return PipelineResult(choice.option.model, result.plan, report, result.float_model)
