"""Beats eager, or eager runs: where the runtime ``auto`` chose is timed no faster than PyTorch
running Dynamo's graph, the original graph runs, the report gives both times, and the decision
is cached (a warm start and the same architecture with other weights time and build nothing).
Timings are injected: the rule is tested, not this machine's speed."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import runtime_choice
from embedl_dynamo.tuning.beat_eager import EagerSpeed, compiled_beats_eager, times_eager
from tests.helpers import BUILD_COUNTS

SLOWER = "eager: 0.41 ms, onnxruntime: 0.55 ms; runs in PyTorch"
CACHED = " (cached decision for this architecture on this CPU; not timed)"


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Tanh()).eval()


def _timings(eager_ms: float, calls: list[list[str]], **runtime_ms: float):
    """A stand-in for the contest: eager at ``eager_ms``, each runtime at its own time (0.55 ms
    when not given); every call's option labels are kept in ``calls``."""

    def measure(runtimes, inputs):
        calls.append(sorted(runtimes))
        return {n: eager_ms if n == "eager" else runtime_ms.get(n, 0.55) for n in runtimes}

    return measure


def _not_timed(runtimes, inputs):
    raise AssertionError(f"a cached decision must not be timed again ({sorted(runtimes)})")


def _compile(model, x, backend="embedl_onnxruntime", **options):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, options=options)
    with torch.no_grad():
        out = compiled(x)
    return compiled, out, embedl_dynamo.last_report()[-1]


def _count_runtime_builds(monkeypatch) -> list[str]:
    built: list[str] = []
    real = Runtime.build

    def build(self, *args, **kwargs):
        built.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runtime, "build", build)
    return built


def _slower_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "slower than PyTorch" in r.getMessage()]


def test_a_runtime_slower_than_eager_leaves_the_original_graph_in_pytorch(monkeypatch, caplog):
    calls: list[list[str]] = []
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.41, calls))
    model, x = _mlp(), torch.randn(1, 16)
    with caplog.at_level(logging.WARNING, "embedl_dynamo"):
        compiled, out, sub = _compile(model, x)
    assert calls == [["eager", "onnxruntime"]]  # one runtime: a contest of two
    assert (sub.status, sub.runtime, sub.reason) == ("eager", "eager", SLOWER)
    assert sub.pipeline["eager_speed"] == {
        "runtime": "onnxruntime",
        "runtime_ms": 0.55,
        "eager_ms": 0.41,
    }
    (message,) = _slower_messages(caplog)
    assert "onnxruntime" in message and "0.55 ms against eager's 0.41 ms" in message
    infers: list[int] = []
    monkeypatch.setattr(OnnxRuntime, "_infer", lambda self, args: infers.append(1))
    with torch.no_grad():
        again = compiled(x + 1)
        assert torch.equal(out, model(x)) and torch.equal(again, model(x + 1))
    assert infers == []  # no runtime runs it


def test_a_warm_start_reuses_the_decision_without_building_or_timing(monkeypatch, caplog):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.41, []))
    model, x = _mlp(), torch.randn(1, 16)
    _compile(model, x)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _not_timed)
    BUILD_COUNTS.clear()
    built = _count_runtime_builds(monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "embedl_dynamo"):
        _, out, sub = _compile(model, x)
    assert (sub.status, sub.runtime, sub.reason, sub.loaded) == ("eager", "eager", SLOWER, "loaded")
    assert built == [] and BUILD_COUNTS["onnx"] == 0
    assert len(_slower_messages(caplog)) == 1  # said on every start, as at the decision
    with torch.no_grad():
        assert torch.equal(out, model(x))


def test_the_same_architecture_with_other_weights_takes_the_cached_decision(monkeypatch):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.41, []))
    x = torch.randn(1, 16)
    _compile(_mlp(0), x)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _not_timed)
    BUILD_COUNTS.clear()
    built = _count_runtime_builds(monkeypatch)
    other = _mlp(1)  # another subgraph key (weights), the same architecture
    _, out, sub = _compile(other, x)
    assert (sub.status, sub.reason, sub.loaded) == ("eager", SLOWER + CACHED, "")
    assert built == ["eager"] and BUILD_COUNTS["onnx"] == 0  # nothing exported
    with torch.no_grad():
        assert torch.equal(out, other(x))


def test_a_runtime_faster_than_eager_runs_and_its_warm_start_is_not_timed(monkeypatch, caplog):
    calls: list[list[str]] = []
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.9, calls, onnxruntime=0.5))
    model, x = _mlp(), torch.randn(1, 16)
    with caplog.at_level(logging.WARNING, "embedl_dynamo"):
        _, out, sub = _compile(model, x)
    assert calls == [["eager", "onnxruntime"]]
    assert (sub.status, sub.runtime) == ("compiled", "onnxruntime")
    assert (
        sub.reason == "auto: onnxruntime, timed fastest here (onnxruntime 0.50 ms, eager 0.90 ms)"
    )
    assert "eager_speed" not in sub.pipeline and not _slower_messages(caplog)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _not_timed)
    _, _, again = _compile(model, x)
    assert (again.status, again.runtime, again.loaded) == ("compiled", "onnxruntime", "loaded")


@pytest.mark.skipif(not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}")
def test_eager_joins_the_runtime_contest_and_beats_its_winner(monkeypatch):
    calls: list[list[str]] = []
    measure = _timings(0.41, calls, onnxruntime=0.55, openvino=0.6)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", measure)
    model, x = _mlp(), torch.randn(1, 16)
    _, out, sub = _compile(model, x, backend="embedl_tensorrt")
    assert calls == [["eager", "onnxruntime", "openvino"]]  # one contest, eager in its rounds
    assert (sub.status, sub.reason) == ("eager", SLOWER)
    with torch.no_grad():
        assert torch.equal(out, model(x))


@pytest.mark.parametrize("options", [{"beat_eager": False}, {"runtime": "onnxruntime"}])
def test_eager_is_not_timed_when_switched_off_or_the_runtime_is_forced(monkeypatch, options):
    calls: list[list[str]] = []
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.01, calls))
    _, _, sub = _compile(_mlp(), torch.randn(1, 16), **options)
    assert calls == [] and (sub.status, sub.runtime) == ("compiled", "onnxruntime")


@pytest.mark.parametrize(
    ("options", "on_cuda", "timed"),
    [
        ({}, False, True),
        ({"precision": "mixed"}, False, True),  # asks for speed; eager's fp32 is in budget
        ({"precision": "int8"}, False, False),  # asked by name: it runs as asked
        ({"precision": "bf16"}, False, False),
        ({"precision": "int4_weight_only"}, False, False),  # asked for memory
        ({"runtime": "openvino"}, False, False),
        ({"beat_eager": False}, False, False),
        ({}, True, False),  # no runtime contest on a CUDA device
    ],
)
def test_where_eager_is_timed(options, on_cuda, timed):
    assert times_eager(Settings(**options), on_cuda) is timed


@pytest.mark.parametrize(("runtime_ms", "wins"), [(0.9, True), (0.97, True), (0.98, False)])
def test_the_runtime_must_beat_eager_by_the_margin(runtime_ms, wins):
    assert compiled_beats_eager(EagerSpeed("onnxruntime", runtime_ms, 1.0)) is wins


def test_beat_eager_takes_a_bool():
    with pytest.raises(ValueError, match="beat_eager='yes'; expected True or False"):
        Settings.from_options({"beat_eager": "yes"})


def test_an_unusable_eager_decision_in_the_warm_cache_is_decided_again(
    monkeypatch, tmp_path, caplog
):
    calls: list[list[str]] = []
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _timings(0.41, calls))
    model, x = _mlp(), torch.randn(1, 16)
    _compile(model, x, cache_dir=str(tmp_path))
    subgraphs = ArtifactCache(tmp_path, "subgraph")
    (entry,) = [p for p in (tmp_path / "subgraph").rglob("*.json") if ".meta." not in p.name]
    key = entry.name[: -len(".json")]
    alias = json.loads(entry.read_text())
    alias["pipeline"]["eager_speed"] = {"runtime": "onnxruntime", "runtime_ms": "fast"}
    subgraphs.put(key, json.dumps(alias).encode(), ".json")
    for choice in (tmp_path / "runtime_choice").rglob("*.json"):
        choice.unlink()  # no cached runtime choice either: it is timed again
    with caplog.at_level(logging.WARNING, "embedl_dynamo"):
        _, _, sub = _compile(model, x, cache_dir=str(tmp_path))
    assert "eager decision unusable" in caplog.text
    assert (sub.status, sub.reason, sub.loaded) == ("eager", SLOWER, "") and len(calls) == 2


def test_a_mixed_graph_that_eager_beat_reports_its_layers_in_fp32():
    from embedl_dynamo.backends.onnxruntime import BACKEND
    from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
    from embedl_dynamo.report.subgraph import SubgraphReport

    report = SubgraphReport(index=3, backend="onnxruntime", runtime="", ops=5, status="")
    report.pipeline = {
        "precision": "mixed",
        "quantized": True,
        "quantization": {"quantized_layers": ["0"]},
        "layers": [{"name": "0", "precision": "int8"}, {"name": "2", "precision": "fp32"}],
    }
    job = SubgraphJob(BACKEND, Settings(precision="mixed"), report, OnnxRuntime, [], 0.0)
    job.eager_won(EagerSpeed("onnxruntime", 0.55, 0.41), SLOWER)
    assert (report.status, report.runtime, report.reason) == ("eager", "eager", SLOWER)
    assert report.pipeline["quantized"] is False and "quantization" not in report.pipeline
    assert [r["precision"] for r in report.pipeline["layers"]] == ["fp32", "fp32"]
    assert report.pipeline["layers"][0]["reason"] == f"PyTorch ran faster ({SLOWER})"
    assert report.pipeline["eager_speed"]["eager_ms"] == 0.41
