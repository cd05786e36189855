"""A Triton repository set up by the serving objective
(:func:`embedl_dynamo.serve.objective.write_triton_for_objective`): the decision's batch becomes
the preferred batch size (warmed up), its workers the instances, its threads the threads per
instance; a static file gets no batching; explicit options win. The decision itself is
:func:`choose_serving`'s (tests/serve/test_objective.py); here it is given."""

from __future__ import annotations

import pytest
import torch
from google.protobuf import text_format
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.serve import objective
from embedl_dynamo.serve.objective import ServingChoice, write_triton_for_objective

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    root = tmp_path_factory.mktemp("objective_triton")
    kw = {"backend": "onnxruntime", "progress": False, "options": {"cache_dir": root / "c"}}
    dynamic = export(model, torch.randn(2, 16), root / "mlp.onnx", **kw)
    static = export(model, torch.randn(2, 16), root / "static.onnx", dynamic_batch=False, **kw)
    return dynamic, static


@pytest.fixture
def decided(monkeypatch):
    asked = []

    def choose(path, **kwargs):
        asked.append(kwargs)
        return ServingChoice("throughput", 16, 1, 100.0, 5.0, "given")

    monkeypatch.setattr(objective, "choose_serving", choose)
    return asked


def _parse(model_dir):
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    return config


def test_the_decision_sets_batching_instances_and_threads(files, tmp_path, decided):
    config = _parse(write_triton_for_objective(files[0], tmp_path, cpus=2, latency_budget_ms=50))
    assert decided[0]["cpus"] == 2 and decided[0]["latency_budget_ms"] == 50
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    assert [w.batch_size for w in config.model_warmup] == [1, 16]
    assert config.instance_group[0].count == 2  # two workers of one thread each
    assert config.parameters["intra_op_thread_count"].string_value == "1"


def test_a_static_file_keeps_its_batch_and_explicit_options_win(files, tmp_path, decided):
    config = _parse(write_triton_for_objective(files[1], tmp_path, cpus=2, instances=1))
    assert config.max_batch_size == 0 and not config.dynamic_batching.preferred_batch_size
    assert config.instance_group[0].count == 1
