"""``precision="int8"`` timed slower than the float graph on its runtime still runs (the user
asked for it), with one warning and a first-screen line giving both numbers and pointing to
``mixed``; where INT8 pays, nothing is said. Timings are stand-ins (the conftest's contest)."""

from __future__ import annotations

import logging

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.tuning import runtime_choice
from tests.helpers import assert_close_to_scale
from tests.models import ResNetLike, randomize_batchnorm


def _timings(int8_ms, fp32_ms):
    def measure(runtimes, inputs):
        return {n: {"int8": int8_ms, "fp32": fp32_ms}.get(n, 1.0) for n in runtimes}

    return measure


def _int8_compile(runtime="onnxruntime"):
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {
        "runtime": runtime,
        "precision": "int8",
        "calibration_data": [x],
        "accuracy_budget": 0.9,
    }
    with torch.no_grad():
        out = torch.compile(model, backend="embedl_tensorrt", options=options)(x)
        assert_close_to_scale(out, model(x), rtol=0.2)
    return embedl_dynamo.last_report()


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_a_slower_int8_runs_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(13.4, 10.0))
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        report = _int8_compile()
    sub = report[-1]
    assert sub.runtime == "onnxruntime" and sub.pipeline["quantized"]  # kept as asked
    assert sub.pipeline["int8_speed"] == {
        "runtime": "onnxruntime",
        "int8_ms": 13.4,
        "fp32_ms": 10.0,
    }
    warnings = [r for r in caplog.records if "slower than float" in r.getMessage()]
    assert len(warnings) == 1 and "13.40 ms against 10.00 ms" in warnings[0].getMessage()
    first_screen = report.summary().splitlines()[:3]
    (line,) = [ln for ln in first_screen if "slower than float" in ln]
    assert "1.34x" in line and "13.40 ms against 10.00 ms" in line and "'mixed'" in line


def test_an_int8_that_pays_is_quiet(monkeypatch, caplog):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(5.0, 10.0))
    with caplog.at_level(logging.INFO, logger="embedl_dynamo.tuning.int8_speed"):
        report = _int8_compile()
    assert report[-1].pipeline["int8_speed"]["int8_ms"] == 5.0
    assert not [r for r in caplog.records if r.name == "embedl_dynamo.tuning.int8_speed"]
    assert "slower" not in report.summary()


@pytest.mark.parametrize("precision", ["mixed", "fp32"])
def test_only_a_forced_int8_is_timed_against_float(monkeypatch, precision):
    def measure(runtimes, inputs):
        assert "int8" not in runtimes, "only precision='int8' is timed against float"
        return {n: 1.0 for n in runtimes}

    monkeypatch.setattr(runtime_choice, "measure_runtimes", measure)
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {
        "runtime": "onnxruntime",
        "precision": precision,
        "calibration_data": [x],
        "accuracy_budget": 0.5,
    }
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    assert "int8_speed" not in embedl_dynamo.last_report()[-1].pipeline


def _no_timing(runtimes, inputs):
    raise AssertionError("the recorded int8 speed must not be measured again")


def test_a_later_compile_reads_the_record_and_still_says_so(monkeypatch, caplog):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(13.4, 10.0))
    _int8_compile()
    torch._dynamo.reset()
    caplog.clear()
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        report = _int8_compile()
    assert report[-1].pipeline["int8_speed"]["int8_ms"] == 13.4
    assert "int8 is 1.34x slower than float" in report.summary()
    assert len([r for r in caplog.records if "slower than float" in r.getMessage()]) == 1


def test_a_corrupt_record_is_timed_again(monkeypatch, caplog, tmp_path):
    import os
    import shutil
    from pathlib import Path

    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(13.4, 10.0))
    _int8_compile()
    embedl_dynamo.wait_for_cache_writes(timeout=60)
    root = Path(os.environ["EMBEDL_DYNAMO_CACHE_DIR"]) / "int8_speed"
    (entry,) = [p for p in root.rglob("*.json") if not p.name.endswith(".meta.json")]
    entry.write_text('{"format": 1, "int8_ms": "fast"}')
    shutil.rmtree(root.parent / "subgraph")  # no warm start: the pipeline runs and reads it
    torch._dynamo.reset()
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(5.0, 10.0))
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        report = _int8_compile()
    assert report[-1].pipeline["int8_speed"]["int8_ms"] == 5.0
    assert f"{entry} is corrupt" in caplog.text and "slower" not in report.summary()
