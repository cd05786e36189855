"""``runtime="auto"`` with several CPU runtimes: a float graph is timed on each, the fastest runs,
the decision is cached (a second compile measures nothing), a runtime that cannot build it is
skipped. Timings themselves are stand-ins here except in the first test."""

from __future__ import annotations

import json

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.backends.tensorrt import BACKEND
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.runtimes import runtime_choice
from embedl_dynamo.runtimes.onnxruntime import OnnxRuntime
from embedl_dynamo.runtimes.openvino import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import assert_close_to_scale
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)
CANDIDATES = [OpenVINORuntime, OnnxRuntime]
REAL_MEASURE = runtime_choice.measure_runtimes


def _graph():
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    gm = run_pipeline(capture(model, (x,)), [x], BACKEND, Settings()).model
    return model, gm, x


def _reference(gm, x):
    out = gm(x)
    return out[0] if isinstance(out, (tuple, list)) else out


def _winner(name):
    def timings(runtimes, inputs):
        return {n: 1.0 if n == name else 2.0 for n in runtimes}

    return timings


def _no_timing(runtimes, inputs):
    raise AssertionError("a cached runtime choice must not be measured again")


def test_real_timing_picks_one_and_a_second_compile_measures_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", REAL_MEASURE)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"cache_dir": str(tmp_path)}
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt", options=options)(x),
                              model(x))  # fmt: skip
        first = embedl_dynamo.last_report()[-1]
        assert first.runtime in ("openvino", "onnxruntime")
        assert first.reason.startswith(f"auto: {first.runtime}, timed fastest here (")
        torch._dynamo.reset()
        monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    second = embedl_dynamo.last_report()[-1]
    assert second.runtime == first.runtime and second.cached  # the warm start's alias says


@pytest.mark.parametrize("name", ["openvino", "onnxruntime"])
def test_the_faster_runtime_runs_and_the_choice_is_cached(monkeypatch, tmp_path, name):
    _, gm, x = _graph()
    settings = Settings(cache_dir=tmp_path)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner(name))
    choice = runtime_choice.fastest_runtime(CANDIDATES, gm, [x], settings)
    assert choice.runtime.name == name and choice.runtime.active
    assert choice.timings[name] == 1.0 and name in choice.note
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    again = runtime_choice.fastest_runtime(CANDIDATES, gm, [x], settings)
    assert again.runtime.name == name and again.timings == {}
    assert again.note == f"auto: {name} (timed faster here before)"
    with torch.no_grad():
        assert_close_to_scale(again.runtime.infer(x)[0], _reference(gm, x))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (None, "is corrupt"),  # bytes that do not match the checksum sidecar
        ({"format": 1, "runtime": "tvm"}, "is invalid"),  # re-signed, naming no candidate
        ({"format": 99, "runtime": "openvino"}, "is invalid"),
    ],
)
def test_a_corrupt_or_stale_decision_is_measured_again(
    monkeypatch, tmp_path, caplog, document, message
):
    from embedl_dynamo.cache.store import ArtifactCache

    _, gm, x = _graph()
    settings = Settings(cache_dir=tmp_path)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner("openvino"))
    runtime_choice.fastest_runtime(CANDIDATES, gm, [x], settings)
    (entry,) = [
        p
        for p in (tmp_path / "runtime_choice").rglob("*.json")
        if not p.name.endswith(".meta.json")
    ]
    if document is None:
        entry.write_text("{}")
    else:  # rewritten with its checksum, as someone editing the cache would
        key = entry.name[: -len(".json")]
        ArtifactCache(tmp_path, "runtime_choice").put(key, json.dumps(document).encode(), ".json")
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner("onnxruntime"))
    choice = runtime_choice.fastest_runtime(CANDIDATES, gm, [x], settings)
    assert choice.runtime.name == "onnxruntime" and choice.timings
    assert message in caplog.text


def test_a_runtime_that_cannot_build_the_graph_is_skipped(monkeypatch, tmp_path):
    _, gm, x = _graph()

    def fails(self, gm, inputs):
        raise RuntimeError("OpenVINO cannot compile it")

    monkeypatch.setattr(OpenVINORuntime, "_build", fails)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    choice = runtime_choice.fastest_runtime(CANDIDATES, gm, [x], Settings(cache_dir=tmp_path))
    assert choice.runtime.name == "onnxruntime" and choice.note == "auto: onnxruntime"


def test_int8_is_not_timed_it_takes_openvino(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"cache_dir": str(tmp_path), "precision": "int8", "calibration_data": [x]}
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    assert embedl_dynamo.last_report()[-1].runtime == "openvino"
