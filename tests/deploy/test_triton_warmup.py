"""Triton configs warm their model up and prefer the batch sizes they are given
(:mod:`embedl_dynamo.deploy.triton_warmup`): ``model_warmup`` holds a request of zeros per batch
size Triton forms, with the config's own input dims, for batching and static files alike; the
preferred sizes are checked against ``max_batch_size``; every config still parses with Triton's
``ModelConfig`` schema (tritonclient's ``model_config_pb2``)."""

from __future__ import annotations

import pytest
import torch
from google.protobuf import text_format
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.deploy.triton_warmup import add_warmup, prefer_batch_sizes
from embedl_dynamo.errors import ExportArgumentError

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        return self.proj(x) * mask


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("warmup")
    example = (torch.randn(2, 6), torch.ones(2, 2))
    kw = {"backend": "onnxruntime", "progress": False, "options": {"cache_dir": root / "cache"}}
    dynamic = export(_Tokens().eval(), example, root / "tokens.onnx", **kw)
    static = export(_Tokens().eval(), example, root / "static.onnx", dynamic_batch=False, **kw)
    return dynamic, static


def _parse(model_dir):
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    return config


def test_a_batching_model_warms_up_each_batch_size_it_prefers(files, tmp_path):
    config = _parse(write_triton_repository(files[0], tmp_path, preferred_batch_sizes=[4, 2, 4]))
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert [(w.name, w.batch_size, w.count) for w in config.model_warmup] == [
        ("zeros_batch_1", 1, 1),
        ("zeros_batch_2", 2, 1),
        ("zeros_batch_4", 4, 1),
    ]
    for warmup in config.model_warmup:
        assert sorted(warmup.inputs) == ["input_0", "input_1"]
        for tensor in config.input:
            sample = warmup.inputs[tensor.name]
            assert sample.zero_data and list(sample.dims) == list(tensor.dims)
            assert sample.data_type == tensor.data_type


def test_without_preferred_sizes_a_batch_of_one_warms_up(files, tmp_path):
    config = _parse(write_triton_repository(files[0], tmp_path))
    assert not config.dynamic_batching.preferred_batch_size
    assert [w.batch_size for w in config.model_warmup] == [1]


def test_a_static_batch_warms_up_once_with_its_full_dims(files, tmp_path):
    config = _parse(write_triton_repository(files[1], tmp_path))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    (warmup,) = config.model_warmup
    assert warmup.batch_size == 1
    assert list(warmup.inputs["input_0"].dims) == [2, 6]


def test_preferred_sizes_beyond_the_batch_limit_are_refused(files, tmp_path):
    with pytest.raises(ExportArgumentError, match=r"\[16\] exceed max_batch_size=8"):
        write_triton_repository(files[0], tmp_path, preferred_batch_sizes=[2, 16])
    with pytest.raises(ExportArgumentError, match="give integers >= 1"):
        write_triton_repository(files[0], tmp_path, preferred_batch_sizes=[0])


def test_a_model_triton_does_not_batch_keeps_no_preferred_sizes(caplog):
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=0)
    prefer_batch_sizes(config, [4])
    assert not config.HasField("dynamic_batching")
    assert "preferred_batch_sizes [4] left out" in caplog.text


def test_an_input_with_another_dynamic_axis_gets_no_warmup():
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    config.input.add(name="ids", data_type=model_config_pb2.TYPE_INT64, dims=[-1])
    add_warmup(config, model_config_pb2)
    assert not config.model_warmup
