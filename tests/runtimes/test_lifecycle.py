"""The rest of the runtime lifecycle of the design documents (AITune's Backend): ``device``,
``is_jit`` and ``deploy(device)`` beside build, activate, deactivate and infer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.runtimes import runtime_classes
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact

X = torch.randn(2, 8)
CPU_RUNTIMES = [
    EagerRuntime,
    OnnxRuntime,
    pytest.param(
        OpenVINORuntime,
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]


def _graph() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    return torch.fx.symbolic_trace(nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval())


def _built(runtime_cls, tmp_path):
    settings = Settings.from_options({"cache_dir": str(tmp_path)}, env={})
    return runtime_cls(settings).build(_graph(), [X], judge_artifact)


def test_only_torch_tensorrt_compiles_inside_its_first_infer():
    jit = {name for name, cls in runtime_classes().items() if cls.is_jit}
    assert jit == {"torch_tensorrt"}


@pytest.mark.parametrize("runtime_cls", CPU_RUNTIMES)
def test_a_cpu_runtime_says_it_runs_on_the_cpu(runtime_cls, tmp_path):
    assert _built(runtime_cls, tmp_path).device == torch.device("cpu")


@pytest.mark.parametrize("runtime_cls", CPU_RUNTIMES)
def test_deploy_pins_the_runtime_and_releases_the_build_state(runtime_cls, tmp_path):
    runtime = _built(runtime_cls, tmp_path)
    expected = runtime.infer(X)
    assert runtime.deploy("cpu") is runtime and runtime.deployed and runtime.judge is None
    with pytest.raises(RuntimeError, match="deployed: it cannot be deactivated"):
        runtime.deactivate()
    assert runtime.active
    torch.testing.assert_close(runtime.infer(X), expected, rtol=0, atol=0)


def test_deploy_to_another_device_names_the_fix(tmp_path):
    runtime = _built(OnnxRuntime, tmp_path)
    with pytest.raises(ValueError, match="runs on cpu, not cuda:0: build it there"):
        runtime.deploy("cuda:0")
    assert not runtime.deployed


def test_deploy_activates_a_deactivated_runtime(tmp_path):
    runtime = _built(OnnxRuntime, tmp_path)
    runtime.deactivate()
    runtime.deploy()
    assert runtime.active and runtime.deployed


def test_load_deploys_what_it_loads(tmp_path):
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    path = embedl_dynamo.export(model, (X,), tmp_path / "m.onnx", backend="onnxruntime")
    loaded = embedl_dynamo.load(path)
    assert loaded.artifact_runtime.deployed and loaded.artifact_runtime.judge is None
    with pytest.raises(RuntimeError, match="cannot be deactivated"):
        loaded.artifact_runtime.deactivate()
    torch.testing.assert_close(loaded(X), model(X), rtol=1e-5, atol=1e-5)
