"""bf16 on OpenVINO: the typed graph or the f32 graph with the bf16 hint, whichever is faster
(timings are stand-ins, except for the numbers of the hint's artifact); the decision is cached
and reported."""

from __future__ import annotations

import functools
import shutil

import onnx
import pytest
import torch
import torch.nn.functional as F

import embedl_dynamo
from embedl_dynamo.backends.openvino import BACKEND
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.rest_precision import (
    ONNX_REST_PRECISION,
    rest_precision,
    with_rest_precision,
)
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.compile import cpu_capabilities
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import half_form, runtime_choice
from tests.helpers import BUILD_COUNTS, count_builds
from tests.models import MobileNetLike

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)
TYPED = "openvino: typed bf16 graph"
HINT = "openvino: f32 graph + bf16 hint"


def _bf16_cpu() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


needs_bf16 = pytest.mark.skipif(not _bf16_cpu(), reason="this CPU does not compute in bf16")


@functools.cache
def _graphs():
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(1, 3, 32, 32)
    frozen = capture(model, (x,))
    result = run_pipeline(frozen, [x], BACKEND, Settings(precision="bf16"))
    return model, frozen, result, x


def _timed(winner):
    def timings(runtimes, inputs):
        return {label: 1.0 if label == winner else 2.0 for label in runtimes}

    return timings


def _no_timing(runtimes, inputs):
    raise AssertionError("a cached half-form decision must not be timed again")


def _choose(result, frozen, x, settings):
    return half_form.choose_half_form(
        result.model, result.float_model, OpenVINORuntime, frozen, [x], settings
    )


@needs_bf16
@pytest.mark.parametrize(
    ("winner", "rest", "other"),
    [
        (HINT, "bf16", "typed graph"),
        (TYPED, None, "f32 graph + hint"),
    ],
)
def test_the_faster_form_runs_and_the_note_says_by_how_much(
    monkeypatch, tmp_path, winner, rest, other
):
    _, frozen, result, x = _graphs()
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timed(winner))
    choice = _choose(result, frozen, x, Settings(precision="bf16", cache_dir=tmp_path))
    assert type(choice.runtime) is OpenVINORuntime and choice.runtime.active
    assert rest_precision(choice.option.model) == rest
    assert choice.runtime.build_info["inference_precision"] == "bf16"
    form = winner.split(": ")[1]
    assert choice.note == f"bf16 on openvino: {form} (timed 0.50x the {other})"


@needs_bf16
def test_the_decision_is_cached_and_a_second_compile_neither_times_nor_exports(
    monkeypatch, tmp_path
):
    model, _, _, x = _graphs()
    count_builds(monkeypatch.setattr)
    options = {"precision": "bf16", "runtime": "openvino", "cache_dir": str(tmp_path)}
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timed(HINT))
    with torch.no_grad():
        torch.compile(model, backend="embedl_openvino", options=options)(x)
        first = embedl_dynamo.last_report()[-1]
        torch._dynamo.reset()
        shutil.rmtree(tmp_path / "subgraph")  # no warm start: the pipeline reads the decision
        BUILD_COUNTS.clear()
        monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
        got = torch.compile(model, backend="embedl_openvino", options=options)(x)
        expected = model(x)
    second = embedl_dynamo.last_report()[-1]
    assert first.reason == "bf16 on openvino: f32 graph + bf16 hint (timed 0.50x the typed graph)"
    assert first.pipeline["half_form"] == first.reason  # the report's key, as export's says
    assert second.reason == (
        "bf16 on openvino: f32 graph + bf16 hint (cached decision for this architecture on "
        "this CPU; not timed)"
    )
    assert BUILD_COUNTS["onnx"] == 0  # both forms' files came from the cache
    assert second.runtime == "openvino" and second.runtime_info["inference_precision"] == "bf16"
    assert F.cosine_similarity(got.flatten(), expected.flatten(), 0) >= 0.99


@needs_bf16
def test_the_hint_artifact_computes_in_bf16_within_the_budget(tmp_path):
    """Not the f32 numbers (which would mean the hint was ignored), and within the budget."""
    model, _, result, x = _graphs()
    settings = Settings(precision="bf16", cache_dir=tmp_path)
    hinted = OpenVINORuntime(settings).build(with_rest_precision(result.float_model, "bf16"), [x])
    f32 = OpenVINORuntime(Settings(cache_dir=tmp_path)).build(result.float_model, [x])
    with torch.no_grad():
        expected = model(x).flatten().double()
    bf16_out = hinted.infer(x)[0].flatten().double()
    f32_out = f32.infer(x)[0].flatten().double()
    assert hinted.build_info["inference_precision"] == "bf16"
    assert f32.build_info["inference_precision"] == "f32"
    assert (bf16_out - expected).abs().max() > 10 * (f32_out - expected).abs().max()
    assert F.cosine_similarity(bf16_out, expected, 0) >= settings.accuracy_budget


@pytest.mark.parametrize(
    ("precision", "runtime", "reason"),
    [
        ("fp32", OpenVINORuntime, "not a half precision: one graph"),
        ("int8", OpenVINORuntime, "Q/DQ graphs have no hint form"),
        ("bf16", OnnxRuntime, "only OpenVINO takes a precision hint"),
    ],
)
def test_one_form_only_where_there_is_no_hint(precision, runtime, reason):
    _, _, result, _ = _graphs()
    options = half_form.half_form_options(
        result.model, result.float_model, runtime, get_precision(precision)
    )
    assert options is None, reason


def test_the_two_forms_are_offered_typed_first_both_as_bf16():
    _, _, result, _ = _graphs()
    options = half_form.half_form_options(
        result.model, result.float_model, OpenVINORuntime, get_precision("bf16")
    )
    assert [o.label for o in options] == [TYPED, HINT]
    assert options[0].model is result.model and rest_precision(options[1].model) == "bf16"
    assert [o.runtime for o in options] == [OpenVINORuntime, OpenVINORuntime]
    assert all(o.lower_precision for o in options)  # timed on equal terms: no margin between


class _NoHalfCore:
    """OpenVINO's Core on a CPU that computes in f32 only."""

    def __init__(self, core):
        self._core = core

    def __getattr__(self, name):
        return getattr(self._core, name)

    def get_property(self, device, name):
        if name == "OPTIMIZATION_CAPABILITIES":
            return ["FP32", "INT8"]
        return self._core.get_property(device, name)


@pytest.fixture
def no_bf16_cpu(monkeypatch):
    import openvino as ov

    real = ov.Core
    monkeypatch.setattr(ov, "Core", lambda: _NoHalfCore(real()))
    cpu_capabilities.cache_clear()
    yield
    cpu_capabilities.cache_clear()


def test_without_bf16_only_the_typed_graph_is_offered_and_it_says_it_runs_f32(
    no_bf16_cpu, tmp_path, caplog
):
    _, _, result, x = _graphs()
    settings = Settings(precision="bf16", cache_dir=tmp_path)
    options = half_form.half_form_options(
        result.model, result.float_model, OpenVINORuntime, get_precision("bf16")
    )
    assert [o.label for o in options] == [TYPED]  # the hint would run f32
    typed = OpenVINORuntime(settings).build(result.model, [x])
    assert typed.build_info["inference_precision"] == "f32"
    note = typed.build_info["half_precision_note"]
    assert note.startswith("this CPU does not compute in bf16") and note in caplog.text


def test_without_bf16_the_typed_graph_runs_and_the_note_says_why(
    no_bf16_cpu, monkeypatch, tmp_path
):
    _, frozen, result, x = _graphs()
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)  # one form built
    choice = _choose(result, frozen, x, Settings(precision="bf16", cache_dir=tmp_path))
    assert type(choice.runtime) is OpenVINORuntime
    assert choice.note == (
        "bf16 on openvino: typed bf16 graph (this CPU does not compute in bf16: the f32 graph "
        "+ hint would run f32)"
    )


@needs_bf16
def test_a_form_below_the_budget_is_not_chosen_however_fast(monkeypatch, tmp_path):
    _, frozen, result, x = _graphs()
    real_infer = OpenVINORuntime._infer

    def negated(self, args):  # the hint form: cosine -1 to the float model, below any budget
        outputs = real_infer(self, args)
        model = onnx.load(self.build_info["artifact"], load_external_data=False)
        hinted = any(p.key == ONNX_REST_PRECISION for p in model.metadata_props)
        return tuple(-t for t in outputs) if hinted else outputs

    monkeypatch.setattr(OpenVINORuntime, "_infer", negated)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)  # one form built
    choice = _choose(result, frozen, x, Settings(precision="bf16", cache_dir=tmp_path))
    assert type(choice.runtime) is OpenVINORuntime
    assert choice.note.endswith("(the f32 graph + hint did not build or missed accuracy_budget)")


@needs_bf16
@pytest.mark.parametrize(("winner", "rest"), [(HINT, "bf16"), (TYPED, None)])
def test_export_writes_the_form_openvino_ran_faster(monkeypatch, tmp_path, winner, rest):
    """The f32 graph + hint form is a float file whose metadata asks for bf16; the typed form
    carries bf16 tensors. Either way the sidecar says which form and why."""
    import json

    model, _, _, x = _graphs()
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timed(winner))
    # ONNX Runtime, which verifies exports, has no bf16 Conv: the typed file goes unverified
    path = embedl_dynamo.export(
        model,
        (x,),
        tmp_path / "m.onnx",
        backend="openvino",
        precision="bf16",
        verify=rest is not None,
        options={"cache_dir": str(tmp_path / "c")},
    )
    written = onnx.load(path)
    props = {p.key: p.value for p in written.metadata_props}
    assert props.get(ONNX_REST_PRECISION) == rest
    bf16 = onnx.TensorProto.BFLOAT16
    typed = any(t.data_type == bf16 for t in written.graph.initializer)
    assert typed == (rest is None)
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert winner.split(": ")[1] in json.dumps(sidecar)
