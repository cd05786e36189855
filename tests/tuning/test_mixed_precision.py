"""``precision="mixed"``: per-layer INT8/fp32 from measured latency and sensitivity, within the
budget, never slower than fp32 as a whole, decisions cached (:mod:`...runtimes.mixed_precision`)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.dynamic_axes import BATCH
from embedl_dynamo.onnx import artifact as artifacts
from embedl_dynamo.quant.int8.stage import calibrate_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.runtimes.onnxruntime.runtime import node_times
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import layer_profile, mixed_precision, mixed_race
from embedl_dynamo.tuning.layer_profile import LayerTimes
from embedl_dynamo.tuning.mixed_precision import choose_mixed
from tests.helpers import BUILD_COUNTS
from tests.models import ResNetLike, randomize_batchnorm

G = torch.Generator().manual_seed(0)
BATCHES = [torch.randn(2, 3, 32, 32, generator=G) for _ in range(3)]


def _calibrated(tmp_path=None):
    model = randomize_batchnorm(ResNetLike().eval())
    target = as_backend("onnxruntime")
    x = BATCHES[0]
    plan = plan_transformation(
        model, [*target.conversion_patterns, *target.fusion_patterns], args=(x,)
    )
    fused = apply_transformation_plan(plan).model
    return calibrate_graph(fused, target.quantizer, BATCHES, use_cache=False)


def test_node_times_read_onnxruntime_profile_events() -> None:
    events = [
        {"cat": "Node", "name": "/gm/conv_a/Conv_kernel_time", "dur": 300},
        {"cat": "Node", "name": "/gm/conv_a/Conv_fence_before", "dur": 5},
        {"cat": "Session", "name": "model_run", "dur": 9000},
        {"cat": "Node", "name": "/gm/fq_relu/QuantizeLinear_kernel_time", "dur": 100},
        {"cat": "Node", "name": "/gm/conv_a/Conv_kernel_time", "dur": 100},
    ]
    times = LayerTimes(node_times(events, runs=2))
    assert times.module_ms("conv_a") == pytest.approx(0.2)  # (300 + 100) us over 2 runs
    assert times.quantizer_ms("relu") == pytest.approx(0.05)
    assert times.module_ms("conv_b") is None and times.quantizer_ms("add") == 0.0


def test_profile_graph_times_every_fused_layer() -> None:
    calibrated = _calibrated()
    times = layer_profile.profile_graph(calibrated.gm, [BATCHES[0]], runs=3)
    modules = [p.module for p in calibrated.placement.layers.values() if p.module]
    assert modules and all(times.module_ms(m) is not None for m in modules)
    assert sum(times.nodes.values()) > 0


def test_placement_without_layers_keeps_points_an_int8_neighbour_needs() -> None:
    placement = _calibrated().placement
    first, *rest = placement.quantized_layers
    only_first = placement.without(set(rest), "test")
    assert only_first.quantized_layers == [first]
    assert set(only_first.activations) == set(placement.layers[first].activations)
    assert set(only_first.weights) == set(placement.layers[first].weights)
    assert {i for i, r in only_first.float_layers if r == "test"} == set(rest)


def _int8_modules(gm) -> int:
    return sum(n.op == "call_module" and n.name.startswith("fq_") for n in gm.graph.nodes)


def _fake_timing(monkeypatch, whole):
    """Whole-graph timing stand-in: ``whole(name, gm)`` gives each candidate's milliseconds."""

    def time_graphs(
        graphs,
        inputs,
        num_threads=None,
        settings=None,
        axes=None,
        runtime=None,
        judge=None,
        artifacts=None,
    ):
        return {name: whole(name, gm) for name, gm in graphs.items()}

    monkeypatch.setattr(mixed_race, "time_graphs", time_graphs)


def _fake_profile(faster: set[str]):
    """Timings where exactly the modules in ``faster`` are quicker in INT8 (and Q/DQ is free)."""

    def profile(gm, inputs, runs=20, num_threads=None, runtime="onnxruntime", **_):
        int8 = any("fq_" in n.name for n in gm.graph.nodes)
        modules = {
            str(n.target)
            for n in gm.graph.nodes
            if n.op == "call_module" and not str(n.target).startswith("fq_")
        }
        nodes = {}
        for module in modules:
            nodes[f"/gm/{module}/Conv"] = 0.5 if int8 and module in faster else 1.0
        return LayerTimes(nodes)

    return profile


def test_layers_int8_only_where_faster_and_reasons_recorded(monkeypatch) -> None:
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = [i for i, p in layers.items() if p.module][:3]
    monkeypatch.setattr(
        mixed_precision, "profile_graph", _fake_profile({layers[i].module for i in fast})
    )
    _fake_timing(monkeypatch, lambda name, gm: {"fp32": 10.0, "mixed": 7.0, "int8": 12.0}[name])
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.9)
    records = {r["id"]: r for r in choice.layers}
    assert set(records) == set(layers)
    int8 = {i for i, r in records.items() if r["precision"] == "int8"}
    assert set(fast) <= int8
    assert all("output cosine" in records[i]["reason"] for i in int8)
    assert all(records[i]["latency_ms"] == 0.5 for i in fast)  # the INT8 time it runs at
    for ident, record in records.items():
        if record["precision"] == "fp32":
            assert record["reason"]
        if ident not in fast and layers[ident].module:
            assert record["precision"] == "fp32" and "not faster" in record["reason"]
    assert set(choice.report["quantized_layers"]) == int8


def test_budget_sends_the_most_sensitive_layers_back_to_float(monkeypatch) -> None:
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    everything = {p.module for p in layers.values() if p.module}
    monkeypatch.setattr(mixed_precision, "profile_graph", _fake_profile(everything))
    _fake_timing(monkeypatch, lambda name, gm: 10.0 - 0.1 * _int8_modules(gm))
    loose = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5)
    strict = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.999999)
    count = lambda c: sum(r["precision"] == "int8" for r in c.layers)  # noqa: E731
    assert count(strict) < count(loose)
    dropped = [r for r in strict.layers if "too sensitive" in r["reason"]]
    assert dropped and all("accuracy_budget" in r["reason"] for r in dropped)
    assert all(r["sensitivity"] is not None for r in dropped)  # measured once it decides


def test_an_int8_set_not_faster_as_a_whole_stays_float(monkeypatch) -> None:
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = {p.module for p in layers.values() if p.module}
    monkeypatch.setattr(mixed_precision, "profile_graph", _fake_profile(fast))
    # 2% faster is within noise: fp32 stays
    _fake_timing(monkeypatch, lambda name, gm: 10.0 if name == "fp32" else 9.8)
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5)
    assert choice.model is calibrated.gm and choice.report is None
    assert all(r["precision"] == "fp32" for r in choice.layers)
    assert any("not faster as a whole" in r["reason"] for r in choice.layers)


def test_decisions_are_cached_and_a_second_run_measures_nothing(monkeypatch, tmp_path) -> None:
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    monkeypatch.setattr(
        mixed_precision, "profile_graph", _fake_profile({p.module for p in layers.values()})
    )
    _fake_timing(monkeypatch, lambda name, gm: 10.0 - 0.1 * _int8_modules(gm))
    first = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5, cache_dir=tmp_path)

    def no_profiling(*args, **kwargs):
        raise AssertionError("a cached decision must not be measured again")

    monkeypatch.setattr(mixed_precision, "profile_graph", no_profiling)
    monkeypatch.setattr(mixed_race, "time_graphs", no_profiling)
    second = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5, cache_dir=tmp_path)
    assert second.layers == first.layers
    (entry,) = [p for p in (tmp_path / "calibration").rglob("*.json") if "int8" in p.read_text()]
    entry.write_text("{not json")  # corrupt: re-measured, not trusted
    monkeypatch.setattr(
        mixed_precision, "profile_graph", _fake_profile({p.module for p in layers.values()})
    )
    _fake_timing(monkeypatch, lambda name, gm: 10.0 - 0.1 * _int8_modules(gm))
    third = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5, cache_dir=tmp_path)
    assert third.layers == first.layers
    assert json.loads(entry.read_text())["format"] == 2


def test_the_float_outputs_are_computed_once(monkeypatch) -> None:
    """The per-layer decision, INT8 everywhere's cosine and the runtime's judge all compare
    against one run of the float graph over the sample."""
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = [i for i, p in layers.items() if p.module][:3]  # a per-layer set short of every layer
    monkeypatch.setattr(
        mixed_precision, "profile_graph", _fake_profile({layers[i].module for i in fast})
    )
    _fake_timing(monkeypatch, lambda name, gm: {"fp32": 10.0, "mixed": 7.0, "int8": 12.0}[name])
    calls = []  # a built graph is a deep copy and carries the hook: count the float graph only
    calibrated.gm.register_forward_hook(lambda module, args, out: calls.append((module, args)))
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5)
    assert {r["precision"] for r in choice.layers} == {"int8", "fp32"}  # INT8 everywhere judged
    # BATCHES[1] is in the judging sample only, so each float run over the sample runs it once
    assert sum(m is calibrated.gm and a[0] is BATCHES[1] for m, a in calls) == 1


def test_each_graph_is_keyed_once_for_its_profile_and_its_timing(monkeypatch, tmp_path) -> None:
    """The all-INT8 graph's artifact is profiled and then timed as a whole: fingerprinted once."""
    keyed = []  # the graphs themselves: ids stay unique while they are held
    fingerprint = artifacts.fingerprint_graph

    def spy(gm):
        keyed.append(gm)
        return fingerprint(gm)

    monkeypatch.setattr(artifacts, "fingerprint_graph", spy)
    timed = []
    time_graphs = mixed_race.time_graphs

    def timing_spy(graphs, inputs, **options):
        timed.append(dict(graphs))
        return time_graphs(graphs, inputs, **options)

    monkeypatch.setattr(mixed_race, "time_graphs", timing_spy)
    calibrated = _calibrated()
    settings = Settings(cache_dir=tmp_path)
    choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5, artifact_settings=settings)
    (graphs,) = timed
    assert "int8" in graphs  # INT8 everywhere holds the budget: it is timed
    assert any(gm is graphs["int8"] for gm in keyed)
    assert max(Counter(map(id, keyed)).values()) == 1


def test_mixed_through_torch_compile_reports_every_layer(tmp_path) -> None:
    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={"precision": "mixed", "calibration_data": BATCHES, "fallback": "raise"},
    )
    with torch.no_grad():
        got, want = compiled(BATCHES[0]), model(BATCHES[0])
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime" and sub.pipeline["precision"] == "mixed"
    assert {r["precision"] for r in sub.pipeline["layers"]} <= {"int8", "fp32"}
    assert all(r["reason"] for r in sub.pipeline["layers"])
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cosine >= 0.99
    # an input the build did not trace: its artifacts were exported under the refit's weight
    # recorder, and the one served answered every input as it answered the build sample
    other = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want, built_on = compiled(other), model(other), model(BATCHES[0])
    error = float((got - want).abs().max()) / float((want - built_on).abs().max())
    assert error < 0.25, error  # the build sample's answer would be 1.0 off


def test_int8_everywhere_wins_when_it_is_fastest_as_a_whole(monkeypatch) -> None:
    """Per-layer times say a few layers lose in INT8, but the whole INT8 graph is fastest."""
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = {p.module for p in list(layers.values())[1:] if p.module}  # the first one "loses"
    monkeypatch.setattr(mixed_precision, "profile_graph", _fake_profile(fast))
    _fake_timing(monkeypatch, lambda name, gm: {"fp32": 10.0, "mixed": 9.0, "int8": 5.0}[name])
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.5)
    assert all(r["precision"] == "int8" for r in choice.layers)
    assert all("INT8 everywhere was fastest as a whole" in r["reason"] for r in choice.layers)
    assert set(choice.report["quantized_layers"]) == set(layers)


def test_whole_graphs_are_timed_as_the_artifacts_the_runtime_deploys(monkeypatch, tmp_path):
    """Dynamic batch as deployed, and the winner's file is reused: no export after timing."""
    timed = []
    real = mixed_race.time_graphs

    def spy(graphs, inputs, **options):
        timed.append((list(graphs), options))
        return real(graphs, inputs, **options)

    monkeypatch.setattr(mixed_race, "time_graphs", spy)
    model = randomize_batchnorm(ResNetLike().eval())
    options = {"precision": "mixed", "calibration_data": BATCHES, "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)
    before = BUILD_COUNTS.get("onnx", 0)
    with torch.no_grad():
        compiled(BATCHES[0])
    ((names, used),) = timed
    assert used["settings"] is not None and used["axes"].inputs[0] == {0: BATCH}
    assert BUILD_COUNTS.get("onnx", 0) - before == len(names)


def test_a_set_the_runtime_gets_wrong_is_refused(monkeypatch):
    """Each candidate is judged on the runtime as built (its integer kernels, not the fake-quant
    graph): OpenVINO 2026.4 returns zeros for some ConvNeXt Q/DQ subsets. A refused per-layer
    set gives way to INT8 everywhere where that holds, else to fp32, with the reason."""
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = [i for i in sorted(layers) if layers[i].module][:2]
    monkeypatch.setattr(
        mixed_precision, "profile_graph", _fake_profile({layers[i].module for i in fast})
    )

    def time_graphs(graphs, inputs, judge=None, **_):
        class _Zeros:  # what the runtime gives for every candidate but fp32
            def infer(self, *batch):
                out = graphs["fp32"](*batch)
                out = out if isinstance(out, (tuple, list)) else (out,)
                return tuple(torch.zeros_like(o) for o in out)

            def module_precisions(self):
                return {}

        kept = {n: g for n, g in graphs.items() if n == "fp32" or judge(n, _Zeros())}
        return {name: {"fp32": 10.0, "mixed": 7.0, "int8": 6.0}[name] for name in kept}

    monkeypatch.setattr(mixed_race, "time_graphs", time_graphs)
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, budget=0.9)
    assert choice.report is None  # every lower candidate refused: fp32
    reasons = {r["reason"] for r in choice.layers if r["id"] in fast}
    assert all("failed the budget on onnxruntime" in r for r in reasons), reasons
