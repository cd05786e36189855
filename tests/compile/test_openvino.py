"""The ``openvino`` runtime: the ONNX artifact on OpenVINO's CPU plugin, through torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.runtimes.artifacts import BUILD_COUNTS
from embedl_dynamo.runtimes.openvino import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import assert_close_to_scale
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)


def test_compiles_through_openvino_with_dynamic_batch_and_one_build():
    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "openvino"})
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 16, 16)
            assert_close_to_scale(compiled(x), model(x))
    assert BUILD_COUNTS["onnx"] == 1
    subs = embedl_dynamo.last_report().subgraphs
    assert {s.runtime for s in subs} == {"openvino"} and subs[-1].cached


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.relu(self.fc(x)))


def test_sequence_length_changes_reuse_the_artifact():
    model = _Tokens().eval()
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "openvino"})
    with torch.no_grad():
        for n in (5, 9, 5, 17):
            x = torch.randn(2, n, 8)
            assert_close_to_scale(compiled(x), model(x))
    assert BUILD_COUNTS["onnx"] == 2


def test_lifecycle_and_int8_qdq_artifact(tmp_path):
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    gm = embedl_dynamo.quantize(model, (x,), backend="onnxruntime", calibration_data=[x])
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path, num_threads=1)).build(gm, [x])
    assert runtime.active and runtime.input_names == ["input_0"]
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(
            runtime.infer(x)[0].flatten(), model(x).flatten(), dim=0
        )
    assert cosine > 0.99
    runtime.deactivate()
    with pytest.raises(RuntimeError, match="not active"):
        runtime.infer(x)


def test_openvino_errors_say_the_cause_not_the_source_file():
    from embedl_dynamo.runtimes.openvino import openvino_cause

    error = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:117:\n"
        "Exception from src/inference/src/dev/plugin.cpp:53:\n"
        "[CPU] FakeQuantize node with name 'q_3' has unsupported input shape\n"
    )
    assert (
        openvino_cause(error)
        == "[CPU] FakeQuantize node with name 'q_3' has unsupported input shape"
    )
    assert (
        openvino_cause(RuntimeError("Exception from src/x.cpp:1:")) == "Exception from src/x.cpp:1:"
    )
