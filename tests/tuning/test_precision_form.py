"""The one step both front doors run (:func:`~embedl_dynamo.tuning.precision_form.transform_for`):
the pipeline, then the form its precision's registry entry names."""

from __future__ import annotations

import torch
from torch import nn

from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.precision import Precision, get_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.half_form import apply_half_form
from embedl_dynamo.tuning.mixed_precision import apply_mixed_form
from embedl_dynamo.tuning.precision_form import FormContext, transform_for

BACKEND = as_backend("onnxruntime")


def _frozen():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    return capture(model, (x,)), [x]


def test_the_registry_names_each_precisions_form():
    assert get_precision("mixed").load_form() is apply_mixed_form
    assert get_precision("fp16").load_form() is apply_half_form
    assert get_precision("bf16").load_form() is apply_half_form
    for name in ("fp32", "int8", "fp8", "int8_weight_only"):
        assert get_precision(name).load_form() is None, name
    # a precision registered with the facts alone gets the form they imply
    half = Precision("half_test", half_dtype=torch.float16)
    assert half.load_form() is apply_half_form


def test_a_form_runs_on_the_pipelines_result_with_the_callers_runtime():
    seen: list[FormContext] = []

    def form(result, context):
        seen.append(context)
        return result

    settings = Settings(precision=Precision("formed", lower=False, form=form))
    graph, inputs = _frozen()
    result = transform_for(graph, inputs, BACKEND, settings, OnnxRuntime, artifact_forms=False)
    (context,) = seen
    assert context.original is graph and context.runtime_cls is OnnxRuntime
    assert not context.artifact_forms and result.report["precision"] == "formed"


def test_int8_calibrating_later_runs_the_float_pipeline_and_no_form():
    graph, inputs = _frozen()
    settings = Settings(precision="int8")
    result = transform_for(graph, inputs, BACKEND, settings, OnnxRuntime, calibrate_later=True)
    assert result.report["precision"] == "fp32" and not result.report["quantized"]
    assert result.model is result.float_model


def test_the_half_form_is_left_to_a_caller_that_chooses_it_while_building():
    graph, inputs = _frozen()
    settings = Settings(precision="bf16")
    result = transform_for(graph, inputs, BACKEND, settings, OnnxRuntime, artifact_forms=False)
    assert "half_form" not in result.report and result.model is not result.float_model
