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
from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import runtime_choice, timer
from embedl_dynamo.tuning.judge import LOWER_PRECISION_MARGIN
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


def _auto(gm, x, settings):
    """``runtime="auto"``'s choice for the float graph ``gm`` among :data:`CANDIDATES`."""
    options = runtime_choice.run_options(gm, None, CANDIDATES[0], CANDIDATES, get_precision("fp32"))
    return runtime_choice.fastest(options, [x], settings)


def _no_timing(runtimes, inputs):
    raise AssertionError("a cached runtime choice must not be measured again")


def test_real_timing_picks_one_and_a_second_compile_measures_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime_choice, "measure_runtimes", REAL_MEASURE)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"cache_dir": str(tmp_path)}
    with torch.no_grad():
        assert_close_to_scale(
            torch.compile(model, backend="embedl_tensorrt", options=options)(x), model(x)
        )
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
    choice = _auto(gm, x, settings)
    assert choice.runtime.name == name and choice.runtime.active
    assert choice.timings[name] == 1.0 and name in choice.note
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    again = _auto(gm, x, settings)
    assert again.runtime.name == name and again.timings == {}
    assert (
        again.note == f"auto: {name} (cached decision for this architecture on this CPU; not timed)"
    )
    with torch.no_grad():
        assert_close_to_scale(again.runtime.infer(x)[0], _reference(gm, x))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (None, "is corrupt"),  # bytes that do not match the checksum sidecar
        ({"format": 2, "option": "tvm"}, "is invalid (format 2, option 'tvm')"),  # no candidate
        ({"format": 1, "option": "openvino"}, "is invalid (format 1, option 'openvino')"),  # stale
    ],
)
def test_a_corrupt_or_stale_decision_is_measured_again(
    monkeypatch, tmp_path, caplog, document, message
):
    from embedl_dynamo.cache.store import ArtifactCache

    _, gm, x = _graph()
    settings = Settings(cache_dir=tmp_path)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner("openvino"))
    _auto(gm, x, settings)
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
    choice = _auto(gm, x, settings)
    assert choice.runtime.name == "onnxruntime" and choice.timings
    assert message in caplog.text


def test_a_runtime_that_cannot_build_the_graph_is_skipped(monkeypatch, tmp_path):
    _, gm, x = _graph()

    def fails(self, gm, inputs):
        raise RuntimeError("OpenVINO cannot compile it")

    monkeypatch.setattr(OpenVINORuntime, "build", fails)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))
    assert choice.runtime.name == "onnxruntime" and choice.note == "auto: onnxruntime"


def test_int8_is_not_timed_it_takes_openvino(monkeypatch, tmp_path):
    def only_against_float(runtimes, inputs):  # int8's speed check (tuning/int8_speed.py)
        assert sorted(runtimes) == ["fp32", "int8"], "int8 is not raced across runtimes"
        return {name: 1.0 for name in runtimes}

    monkeypatch.setattr(runtime_choice, "measure_runtimes", only_against_float)
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"cache_dir": str(tmp_path), "precision": "int8", "calibration_data": [x]}
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    assert embedl_dynamo.last_report()[-1].runtime == "openvino"


def _int8_pays(monkeypatch):
    """Inside ``mixed``: every layer and the INT8 graph as a whole timed faster in INT8."""
    from embedl_dynamo.tuning import mixed_precision, mixed_race
    from embedl_dynamo.tuning.layer_profile import LayerTimes

    def profile(gm, inputs, runs=20, num_threads=None, runtime="onnxruntime", **_):
        int8 = any("fq_" in n.name for n in gm.graph.nodes)
        modules = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
        return LayerTimes({f"/gm/{m}/Conv": 0.5 if int8 else 1.0 for m in modules})

    def whole(graphs, inputs, **_):
        times = {"fp32": 10.0, "bf16": 8.0, "mixed": 6.0, "int8": 5.0, "int8 (fp32 rest)": 5.5}
        return {name: times[name] for name in graphs}

    monkeypatch.setattr(mixed_precision, "profile_graph", profile)
    monkeypatch.setattr(mixed_race, "time_graphs", whole)


def _mixed_compile(tmp_path, monkeypatch, winner, measure=None):
    """Compile with ``precision="mixed"``; ``measure`` (the winner by default) times the auto
    choice. The caller fakes the mixed measurement (:func:`_int8_pays`)."""
    monkeypatch.setattr(runtime_choice, "measure_runtimes", measure or _winner(winner))
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(2, 3, 16, 16, generator=g) for _ in range(3)]
    options = {
        "cache_dir": str(tmp_path),
        "precision": "mixed",
        "calibration_data": data,
        "accuracy_budget": 0.9,
    }
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = torch.compile(model, backend="embedl_tensorrt", options=options)(x)
        assert_close_to_scale(out, model(x), rtol=0.2)
    return embedl_dynamo.last_report()[-1]


def test_mixed_competes_with_the_float_graph_on_every_other_runtime(monkeypatch, tmp_path):
    """``mixed`` is the fastest way within the budget: where the float graph on another CPU
    runtime beats the mixed graph, the float graph runs and every layer says why."""
    _int8_pays(monkeypatch)
    sub = _mixed_compile(tmp_path, monkeypatch, "onnxruntime fp32")
    assert sub.runtime == "onnxruntime" and "auto: onnxruntime fp32" in sub.reason
    layers = sub.pipeline["layers"]
    assert layers and all(r["precision"] == "fp32" for r in layers)
    assert all(r["reason"].startswith("the float graph ran faster") for r in layers)
    assert sub.pipeline["quantized"] is False and "quantization" not in sub.pipeline


def test_mixed_runs_when_it_wins(monkeypatch, tmp_path):
    _int8_pays(monkeypatch)
    sub = _mixed_compile(tmp_path, monkeypatch, "openvino mixed")
    assert sub.runtime == "openvino" and "auto: openvino mixed" in sub.reason
    assert any(r["precision"] == "int8" for r in sub.pipeline["layers"])


@pytest.mark.parametrize(
    ("winner", "runs"), [("openvino mixed", "openvino"), ("onnxruntime fp32", "onnxruntime")]
)
def test_what_mixed_measured_is_not_judged_or_timed_again(monkeypatch, tmp_path, winner, runs):
    """``mixed`` held its graph to the budget on its runtime and timed it against the float
    graph there: the auto choice times it only against the float graph on the other runtimes
    (which can still win), and the mixed artifact it chose is not judged again."""
    import importlib

    from embedl_dynamo.tuning import mixed_race

    compile_module = importlib.import_module("embedl_dynamo.dynamo.graph_build")
    real_time_graphs = mixed_race.time_graphs
    _int8_pays(monkeypatch)  # the layer profile; the whole-graph timing is replaced below

    def whole(graphs, inputs, **options):  # built and judged on the runtime; timings fixed
        kept = real_time_graphs(graphs, inputs, **options)
        times = {"fp32": 10.0, "bf16": 8.0, "mixed": 6.0, "int8": 5.0, "int8 (fp32 rest)": 5.5}
        return {name: times[name] for name in kept}

    monkeypatch.setattr(mixed_race, "time_graphs", whole)
    timed, judged = [], []

    def measure(runtimes, inputs):
        timed.append(sorted(runtimes))
        return _winner(winner)(runtimes, inputs)

    real_check = compile_module.check_precision

    def check(runtime, *args):
        judged.append(runtime.name)
        return real_check(runtime, *args)

    monkeypatch.setattr(compile_module, "check_precision", check)
    sub = _mixed_compile(tmp_path, monkeypatch, winner, measure)
    assert sub.runtime == runs and f"auto: {winner}" in sub.reason
    assert any(r["precision"] == "int8" for r in sub.pipeline["layers"]) == (runs == "openvino")
    # not the float graph on openvino; PyTorch itself, which the winner must beat (beat_eager)
    assert timed == [["eager", "onnxruntime fp32", "openvino mixed"]]
    assert judged == []


def test_a_rejected_int8_artifact_falls_back_to_the_fastest_float_runtime(monkeypatch, tmp_path):
    """INT8 below the budget runs the float graph, timed like any float graph (not on the INT8
    runtime by default)."""
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner("onnxruntime"))
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {
        "cache_dir": str(tmp_path),
        "precision": "int8",
        "calibration_data": [x],
        "accuracy_budget": 0.999999,
    }
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    sub = embedl_dynamo.last_report()[-1]
    assert sub.reason.startswith("int8 rejected, fp32 runs")
    assert sub.runtime == "onnxruntime"


def test_lower_precision_is_judged_on_the_sample_and_calibration_batches():
    from embedl_dynamo.tuning.judge import judging_sample

    x = torch.randn(2, 3)
    same = [torch.randn(2, 3) for _ in range(3)]
    assert len(judging_sample([x], same)) == 3  # the sample and two calibration batches
    larger = torch.randn(4, 3)  # more samples than the build's: judged on its first ones
    sample = judging_sample([x], [larger])
    assert len(sample) == 2 and torch.equal(sample[1][0], larger[:2])
    assert len(judging_sample([x], [torch.randn(1, 3)])) == 1  # fewer: not comparable
    assert len(judging_sample([x], [torch.randn(2, 4)])) == 1  # another shape: not comparable
    assert len(judging_sample([x], [larger.double()])) == 1  # another dtype: not comparable
    assert len(judging_sample([x], lambda model: None)) == 1  # a forward_loop: the sample only


class _FakeClock:
    """A clock that only the options move: each call of an option takes its given seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def option(self, seconds):
        calls = []

        def call():
            calls.append(1)
            self.now += seconds

        return call, calls


def test_timing_stops_once_the_ranking_is_clear():
    clock = _FakeClock()
    (fast, fast_calls), (slow, slow_calls) = clock.option(0.002), clock.option(0.02)
    timings = timer.time_options({"fast": fast, "slow": slow}, clock=clock)
    assert timings == pytest.approx({"fast": 2.0, "slow": 20.0})
    # warm-up and three rounds of two calls: a 10x gap needs no more
    assert len(fast_calls) == len(slow_calls) == timer.WARMUP + 2 * timer.MIN_ROUNDS


def test_timing_of_close_options_goes_on_until_the_budget_is_spent():
    clock = _FakeClock()
    (a, a_calls), (b, b_calls) = clock.option(0.010), clock.option(0.0101)
    timings = timer.time_options({"a": a, "b": b}, clock=clock)
    assert len(a_calls) == len(b_calls)  # round-robin: every option as often
    assert timings == pytest.approx({"a": 10.0, "b": 10.1})
    rounds = (len(a_calls) - timer.WARMUP) // 2
    assert timer.MIN_ROUNDS < rounds < timer.MAX_ROUNDS
    assert 2 * rounds * (0.010 + 0.0101) >= timer.BUDGET_S  # the budget, not the round cap


def test_long_calls_settle_with_a_pause_instead_of_an_untimed_call():
    """A large graph's calls: the pause lets the other option's threads settle at a fraction
    of an untimed call's cost; short calls keep theirs."""
    clock = _FakeClock()
    pauses = []

    def sleep(seconds):
        pauses.append(seconds)
        clock.now += seconds

    (fast, fast_calls), (slow, slow_calls) = clock.option(0.15), clock.option(0.3)
    (short, short_calls) = clock.option(0.001)
    timings = timer.time_options({"fast": fast, "slow": slow, "short": short}, clock, sleep)
    assert timings == pytest.approx({"fast": 150.0, "slow": 300.0, "short": 1.0})
    rounds = timer.MIN_ROUNDS  # a 2x gap settles it in the least rounds
    assert len(fast_calls) == len(slow_calls) == timer.WARMUP + rounds
    assert len(short_calls) == timer.WARMUP + 2 * rounds
    assert pauses == [timer.SETTLE_S] * (2 * rounds)
    assert timer.SETTLE_S < timer.LONG_CALL_S  # a pause costs less than the call it replaces


def test_one_option_is_timed_for_the_least_rounds():
    clock = _FakeClock()
    only, calls = clock.option(0.001)
    assert timer.time_options({"only": only}, clock=clock) == pytest.approx({"only": 1.0})
    assert len(calls) == timer.WARMUP + 2 * timer.MIN_ROUNDS


def test_a_lower_precision_must_win_by_the_margin():
    lower = {"mixed"}
    margin = LOWER_PRECISION_MARGIN
    assert timer.fastest_of({"fp32": 10.0, "mixed": 10.0 * margin * 0.999}, lower) == "mixed"
    assert timer.fastest_of({"fp32": 10.0, "mixed": 10.0 * margin * 1.001}, lower) == "fp32"
    # the margin is for lower precisions only: between float options, faster is faster
    assert timer.fastest_of({"onnxruntime": 10.0, "openvino": 9.9}) == "openvino"
    assert timer.fastest_of({"a": 1.0, "b": 1.0}) == "a"  # a tie favours the earlier
    with pytest.raises(ValueError, match="no timed option"):
        timer.fastest_of({})


def test_mixed_on_its_runtime_is_a_lower_precision_option():
    _, gm, _ = _graph()
    options = runtime_choice.run_options(
        gm, gm, OpenVINORuntime, CANDIDATES, get_precision("mixed")
    )
    assert [(o.label, o.lower_precision) for o in options] == [
        ("openvino mixed", True),
        ("onnxruntime fp32", False),
    ]


def test_one_export_serves_every_runtime_and_is_not_verified_again(monkeypatch, tmp_path):
    """The graph is fingerprinted, exported and run on the sample once; each runtime builds
    from that file without hashing it again, and reports it as built now, not as found in the
    cache."""
    from embedl_dynamo.cache import store
    from embedl_dynamo.onnx import artifact as artifacts

    _, gm, x = _graph()
    runs, forward = [], gm.forward
    gm.forward = lambda *a: runs.append(1) or forward(*a)
    fingerprints, hashed = [], []
    real_fingerprint, real_sha = artifacts.fingerprint_graph, store.file_digest
    monkeypatch.setattr(
        artifacts, "fingerprint_graph", lambda g: fingerprints.append(1) or real_fingerprint(g)
    )
    monkeypatch.setattr(store, "file_digest", lambda p: hashed.append(p) or real_sha(p))
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _winner("openvino"))
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))
    assert choice.option.label == "openvino"
    # one run for the exporter to trace, one shared by the export and both runtimes' checks
    assert len(fingerprints) == 1 and len(runs) == 2
    assert not [p for p in hashed if p.suffix == ".onnx"]
    assert not choice.runtime.from_cache
    assert_close_to_scale(choice.runtime(x)[0], _reference(gm, x))
