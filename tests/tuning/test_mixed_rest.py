"""``mixed``'s third choice: where the runtime computes faster in a half type (bf16 on OpenVINO
on a CPU with it), the layers left out of INT8 run in it, and the float graph in it competes
as a whole (:mod:`embedl_dynamo.tuning.mixed_race`)."""

from __future__ import annotations

import functools
from collections import Counter

import torch

from embedl_dynamo.graph.rest_precision import rest_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime, node_times
from embedl_dynamo.tuning import mixed_precision, mixed_race
from embedl_dynamo.tuning.mixed_precision import choose_mixed
from embedl_dynamo.tuning.mixed_race import INT8_FP32_REST
from tests.tuning.test_mixed_precision import BATCHES, _fake_profile
from tests.tuning.test_mixed_precision import _calibrated as _calibrate

_calibrated = functools.cache(_calibrate)  # read only here: choose_mixed builds new graphs


class _HalfRuntime(OnnxRuntime):
    """A runtime that says it computes unquantized layers faster in bf16."""

    name = "half_runtime"

    @classmethod
    def rest_precision(cls) -> str | None:
        return "bf16"

    @classmethod
    def layer_profiler(cls):
        return node_times


class _Built:
    """What the runtime gives for a candidate: its graph's outputs, or zeros where ``wrong``."""

    def __init__(self, gm, wrong: bool) -> None:
        self.gm, self.wrong = gm, wrong

    def infer(self, *batch):
        out = self.gm(*batch)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(torch.zeros_like(o) if self.wrong else o for o in out)

    def key(self) -> str:
        return "artifact-key"

    def module_precisions(self) -> dict[str, str]:
        return {}


def _race(monkeypatch, times: dict[str, float], wrong=lambda name, gm: False) -> list[dict]:
    """Stand in for the runtime: each candidate judged (zeros where ``wrong``) and timed at
    ``times[name]``; returns what each race saw: {name: rest precision}."""
    seen: list[dict] = []

    def time_graphs(graphs, inputs, judge=None, **_):
        seen.append({name: rest_precision(gm) for name, gm in graphs.items()})
        kept = [n for n, gm in graphs.items() if n == "fp32" or judge(n, _Built(gm, wrong(n, gm)))]
        return {name: times.get(name, times.get("int8", 0) + 1.0) for name in kept}

    monkeypatch.setattr(mixed_race, "time_graphs", time_graphs)
    return seen


def _profiled(monkeypatch, count=3):
    """The calibrated graph, and the ids of its first ``count`` layers, which the stand-in
    profile times faster in INT8 (the rest are not)."""
    calibrated = _calibrated()
    layers = calibrated.placement.layers
    fast = [i for i, p in layers.items() if p.module][:count]
    faster = _fake_profile({layers[i].module for i in fast})
    monkeypatch.setattr(mixed_precision, "profile_graph", faster)
    return calibrated, fast


def test_int8_where_faster_and_the_rest_in_bf16(monkeypatch) -> None:
    calibrated, fast = _profiled(monkeypatch)
    seen = _race(monkeypatch, {"fp32": 10.0, "bf16": 6.0, "mixed": 4.0, "int8": 7.0})
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, runtime=_HalfRuntime)
    # every lower candidate runs its unquantized layers in bf16; fp32 stays fp32
    assert seen == [
        {"fp32": None, "bf16": "bf16", "mixed": "bf16", "int8": "bf16", INT8_FP32_REST: None}
    ]
    precisions = Counter(r["precision"] for r in choice.layers)
    assert set(precisions) == {"int8", "bf16"} and precisions["int8"] >= len(fast)
    assert rest_precision(choice.model) == "bf16" and choice.report is not None
    rest = [r for r in choice.layers if r["precision"] == "bf16"]
    assert all("bf16 on half_runtime was faster than fp32" in r["reason"] for r in rest)
    assert all("latency_bf16_ms" in r for r in choice.layers)


def test_bf16_everywhere_when_it_wins_as_a_whole(monkeypatch) -> None:
    calibrated, _ = _profiled(monkeypatch)
    _race(monkeypatch, {"fp32": 10.0, "bf16": 5.0, "mixed": 7.0, "int8": 8.0})
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, runtime=_HalfRuntime)
    assert {r["precision"] for r in choice.layers} == {"bf16"}
    assert choice.report is None and rest_precision(choice.model) == "bf16"
    # the same float graph computing: weights shared, outputs equal
    assert torch.equal(choice.model(BATCHES[1]), calibrated.gm(BATCHES[1]))


def test_fp32_wins_when_nothing_lower_is_faster(monkeypatch) -> None:
    calibrated, _ = _profiled(monkeypatch)
    _race(monkeypatch, {"fp32": 10.0, "bf16": 9.9, "mixed": 9.95, "int8": 12.0})
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, runtime=_HalfRuntime)
    assert {r["precision"] for r in choice.layers} == {"fp32"}
    assert rest_precision(choice.model) is None and choice.report is None


def test_int8_with_bf16_failing_the_budget_is_measured_again_with_fp32(monkeypatch) -> None:
    calibrated, fast = _profiled(monkeypatch)
    times = {"fp32": 10.0, "bf16": 6.0, "mixed": 4.0, "int8": 7.0}
    seen = _race(monkeypatch, times, wrong=lambda name, gm: rest_precision(gm) is not None)
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, runtime=_HalfRuntime)
    first = {"fp32", "bf16", "mixed", "int8", INT8_FP32_REST}
    assert [set(s) for s in seen] == [first, {"fp32", "mixed", "int8"}]
    assert all(rest is None for rest in seen[1].values())
    assert {r["precision"] for r in choice.layers} == {"int8", "fp32"}
    assert rest_precision(choice.model) is None


def test_the_rest_precision_is_cached_with_the_decisions(monkeypatch, tmp_path) -> None:
    calibrated, _ = _profiled(monkeypatch)
    seen = _race(monkeypatch, {"fp32": 10.0, "bf16": 6.0, "mixed": 4.0, "int8": 7.0})
    kwargs = {"runtime": _HalfRuntime, "cache_dir": tmp_path}
    first = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, **kwargs)
    second = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, **kwargs)
    assert len(seen) == 1  # the second call measured nothing
    assert second.layers == first.layers and rest_precision(second.model) == "bf16"


def test_int8_with_an_fp32_rest_wins_where_the_half_rest_does_not_pay(monkeypatch) -> None:
    """``mixed`` is never slower than ``int8`` itself: INT8 everywhere with the rest in fp32
    races beside the bf16 rest, and wins where bf16 around INT8 costs more than it saves."""
    calibrated, _ = _profiled(monkeypatch)
    times = {"fp32": 10.0, "bf16": 6.0, "mixed": 5.0, "int8": 5.5, INT8_FP32_REST: 4.0}
    _race(monkeypatch, times)
    choice = choose_mixed(calibrated, [BATCHES[0]], BATCHES, 0.9, runtime=_HalfRuntime)
    assert {r["precision"] for r in choice.layers} == {"int8"}
    assert rest_precision(choice.model) is None and choice.report is not None
    assert all(r["reason"].startswith("INT8 everywhere was fastest") for r in choice.layers)
