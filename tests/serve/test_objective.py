"""``objective="throughput"``: every batch size x thread split measured, the pick consistent with
the measurements and the latency budget, the decision cached. (Which setting is fastest is the
machine's business, not the test's: python -m bench run serving --objective shows the numbers.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.serve import objective
from embedl_dynamo.serve.objective import ServingChoice, choose_serving
from embedl_dynamo.serve.ray_serve import replica_plan


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    root = tmp_path_factory.mktemp("objective")
    dynamic = export(model, torch.randn(2, 16), root / "mlp.onnx", backend="onnxruntime")
    static = export(
        model, torch.randn(2, 16), root / "static.onnx", backend="onnxruntime", dynamic_batch=False
    )
    return dynamic, static


@pytest.fixture
def torch_threads_kept():
    threads = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == threads  # measuring leaves the process's threads alone


def test_throughput_measures_every_setting_picks_the_best_and_caches_it(
    files, tmp_path, monkeypatch, torch_threads_kept
):
    kw = {"cpus": 2, "batch_sizes": (1, 4), "runs": 3, "cache_dir": tmp_path}
    choice = choose_serving(files[0], **kw)
    settings = {(c["batch"], c["threads"], c["workers"]) for c in choice.candidates}
    assert settings == {(1, 2, 1), (1, 1, 2), (4, 2, 1), (4, 1, 2)}
    best = max(choice.candidates, key=lambda c: c["samples_s"])
    assert (choice.batch, choice.threads, choice.samples_s) == (
        best["batch"],
        best["threads"],
        best["samples_s"],
    )

    def measure(*args):
        raise AssertionError("a cached decision measures nothing")

    monkeypatch.setattr(objective, "_measure", measure)
    again = choose_serving(files[0], **kw)
    assert (again.batch, again.threads) == (choice.batch, choice.threads)
    assert "cached decision" in again.note


def test_the_latency_budget_bounds_the_pick(files, tmp_path):
    kw = {"cpus": 2, "batch_sizes": (1, 4), "runs": 3}
    tight = choose_serving(files[0], latency_budget_ms=1e-9, cache_dir=tmp_path / "a", **kw)
    assert "no setting keeps p99 within" in tight.note
    assert tight.p99_ms == min(c["p99_ms"] for c in tight.candidates)
    loose = choose_serving(files[0], latency_budget_ms=1e9, cache_dir=tmp_path / "b", **kw)
    assert loose.samples_s == max(c["samples_s"] for c in loose.candidates)


def test_latency_and_static_batch_files(files, tmp_path):
    latency = choose_serving(files[0], objective="latency", cpus=2, cache_dir=tmp_path)
    assert (latency.batch, latency.threads, latency.candidates) == (1, 2, [])
    static = choose_serving(files[1], cpus=1, runs=2, cache_dir=tmp_path)
    assert {c["batch"] for c in static.candidates} == {1}  # a static batch is never stacked
    with pytest.raises(ValueError, match="objective='fast'"):
        choose_serving(files[0], objective="fast")


@pytest.mark.parametrize(
    "batch, threads, replicas, cpus, plan",
    [
        (32, 1, 1, 2, (2, 1, 1, 32)),  # one replica of 2 CPUs -> two of 1 CPU, batches of 32
        (8, 2, 3, 2, (3, 2, 2, 8)),  # the measured split is the one asked for
        (1, 4, 2, 2, (2, 2, 2, 1)),  # never more threads than a replica's CPUs
    ],
)
def test_the_deployment_takes_the_choices_batch_and_threads(batch, threads, replicas, cpus, plan):
    choice = ServingChoice("throughput", batch, threads, 1.0, 1.0, "measured")
    assert replica_plan(choice, replicas, cpus) == plan


def test_build_app_passes_deployment_options_and_refuses_its_own(files):
    pytest.importorskip("ray.serve")
    from embedl_dynamo.serve.ray_serve import build_app

    app = build_app(files[0], replicas=2, deployment_options={"health_check_period_s": 0.5})
    config = app._bound_deployment._deployment_config  # Ray Serve's own record of the options
    assert (config.health_check_period_s, config.num_replicas) == (0.5, 2)
    with pytest.raises(ValueError, match=r"deployment_options sets \['num_replicas'\]"):
        build_app(files[0], deployment_options={"num_replicas": 3})


@pytest.mark.parametrize("wait", [-0.001, float("nan"), "0.01"])
def test_build_app_refuses_a_batch_wait_that_is_no_duration(files, wait):
    pytest.importorskip("ray.serve")
    from embedl_dynamo.serve.ray_serve import build_app

    with pytest.raises(ValueError, match="batch_wait_timeout_s=.*: give seconds >= 0"):
        build_app(files[0], batch_wait_timeout_s=wait)
