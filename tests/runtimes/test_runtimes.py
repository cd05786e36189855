"""The runtime lifecycle (AITune-style), ONNX Runtime details, and the TensorRT runtimes."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo.backends.tensorrt import BACKEND
from embedl_dynamo.errors import RuntimeUnavailableError
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.runtimes import runtime_candidates, runtime_classes
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.onnxruntime.session import create_session, ort_providers
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import judge_artifact
from tests.helpers import BUILD_COUNTS
from tests.models import ResNetLike, randomize_batchnorm

RUNTIMES = runtime_classes()
requires_tensorrt = pytest.mark.skipif(
    not RUNTIMES["tensorrt"].is_available(),
    reason=f"TensorRT runtime unavailable: {RUNTIMES['tensorrt'].missing()}",
)
requires_torch_tensorrt = pytest.mark.skipif(
    not RUNTIMES["torch_tensorrt"].is_available(),
    reason=f"Torch-TensorRT unavailable: {RUNTIMES['torch_tensorrt'].missing()}",
)


def _counting(gm):
    """A copy of ``gm`` whose calls are counted in ``copy.calls``."""
    import copy

    counted = copy.deepcopy(gm)
    counted.calls = 0
    forward = counted.forward

    def wrapper(*args):
        counted.calls += 1
        return forward(*args)

    counted.forward = wrapper
    return counted


@pytest.fixture(scope="module")
def transformed():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    result = run_pipeline(capture(model, (x,)), [x], BACKEND)
    return model, result.model, x


def _settings(tmp_path, **kw):
    return Settings.from_options({"cache_dir": str(tmp_path), **kw}, env={})


def test_onnxruntime_lifecycle(transformed, tmp_path):
    model, gm, x = transformed
    rt = OnnxRuntime(_settings(tmp_path))
    with pytest.raises(RuntimeError, match="not active"):
        rt.infer(x)
    OnnxRuntime(_settings(tmp_path)).build(gm, [x])  # fills the cache
    counting = _counting(gm)
    assert rt.build(counting, [x], judge_artifact) is rt
    assert rt.build(counting, [x], judge_artifact) is rt  # idempotent
    assert counting.calls == 1  # the sample ran once, for the judge
    assert BUILD_COUNTS["onnx"] == 1
    assert rt.active and rt.key() and "onnxruntime (cached)" in rt.describe()
    torch.testing.assert_close(rt.infer(x)[0], model(x).detach(), rtol=1e-4, atol=1e-5)
    rt.deactivate()
    with pytest.raises(RuntimeError, match="not active"):
        rt.infer(x)
    rt.activate()
    torch.testing.assert_close(rt.infer(x)[0], model(x).detach(), rtol=1e-4, atol=1e-5)


def _relu_file(tmp_path):
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("policy", [None, "PASSIVE", "passive"])
def test_sessions_spin_within_runs_only_and_keep_a_callers_own_options(
    tmp_path, monkeypatch, policy
):
    """Workers that sleep between a run's ops are woken for each (a decode step ran about a
    sixth slower); they stop spinning when the run returns, leaving the cores to PyTorch
    between our calls; a caller's own value is kept."""
    import onnxruntime as ort

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if policy is not None:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    path = _relu_file(tmp_path)
    config = create_session(path).get_session_options().get_session_config_entry
    assert config("session.intra_op.allow_spinning") == "1"
    assert config("session.force_spinning_stop") == "1"
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    mine = create_session(path, options=options).get_session_options()
    assert mine.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_sessions_sleep_where_pytorchs_workers_keep_spinning(tmp_path, monkeypatch):
    """OMP_WAIT_POLICY=ACTIVE: PyTorch's OpenMP workers keep spinning; ours do not fight them."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    config = create_session(_relu_file(tmp_path)).get_session_options().get_session_config_entry
    assert config("session.intra_op.allow_spinning") == "0"


def test_onnxruntime_outputs_share_memory_with_ort(transformed, tmp_path):
    _, gm, x = transformed
    rt = OnnxRuntime(_settings(tmp_path, num_threads=1)).build(gm, [x])
    (out,) = rt.infer(x)
    assert out.is_contiguous() and out.dtype == torch.float32
    assert out.numpy().base is not None  # a view of ORT's array, not a copy


def test_the_first_served_call_on_the_checked_sample_reuses_the_checks_outputs(
    transformed, tmp_path, monkeypatch
):
    model, gm, x = transformed
    runs = []
    real = OnnxRuntime._infer
    monkeypatch.setattr(OnnxRuntime, "_infer", lambda self, a: runs.append(1) or real(self, a))
    rt = OnnxRuntime(_settings(tmp_path)).build(gm, [x])
    assert len(runs) == 1  # the check
    serve = rt.serve()
    (first,) = serve(x)
    assert len(runs) == 1  # Dynamo's first call, on the sample it compiled for: no second run
    torch.testing.assert_close(first, model(x).detach(), rtol=1e-4, atol=1e-5)
    serve(x)
    assert len(runs) == 2  # only the first call
    sample = x.clone()
    rt = OnnxRuntime(_settings(tmp_path)).build(gm, [sample])
    sample.mul_(2)  # the sample changed in place after the check: its outputs are stale
    before = len(runs)
    (out,) = rt.serve()(sample)
    assert len(runs) == before + 1
    torch.testing.assert_close(out, model(sample).detach(), rtol=1e-4, atol=1e-5)
    rt = OnnxRuntime(_settings(tmp_path)).build(gm, [x])
    before = len(runs)
    rt.serve()(x.clone())  # equal values in another tensor: run, not assumed
    assert len(runs) == before + 1


def test_a_first_served_call_under_inference_mode_returns_inference_tensors(
    transformed, tmp_path, monkeypatch
):
    """Dynamo builds outside inference mode, so the check's outputs are ordinary tensors; a
    first call under ``torch.inference_mode`` runs again rather than return them (as a KV
    cache they failed Dynamo's dispatch-key guards on every later ``generate()``)."""
    model, gm, x = transformed
    runs = []
    real = OnnxRuntime._infer
    monkeypatch.setattr(OnnxRuntime, "_infer", lambda self, a: runs.append(1) or real(self, a))
    rt = OnnxRuntime(_settings(tmp_path)).build(gm, [x])
    assert len(runs) == 1 and not torch.is_inference_mode_enabled()
    with torch.inference_mode():
        (first,) = rt.serve()(x)
    assert len(runs) == 2 and first.is_inference()
    torch.testing.assert_close(first, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_onnxruntime_second_runtime_uses_cache(transformed, tmp_path):
    _, gm, x = transformed
    OnnxRuntime(_settings(tmp_path)).build(gm, [x])
    rt = OnnxRuntime(_settings(tmp_path)).build(gm, [x])
    assert rt.from_cache and BUILD_COUNTS["onnx"] == 1 and "(cached)" in rt.describe()


def test_providers_prefer_gpu_then_cpu():
    providers = ort_providers()
    assert providers[-1] == "CPUExecutionProvider"
    order = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert providers == [p for p in order if p in providers]


def test_eager_runtime(transformed, tmp_path):
    model, gm, x = transformed
    rt = EagerRuntime(_settings(tmp_path)).build(gm, [x])
    torch.testing.assert_close(rt.infer(x)[0], model(x).detach(), rtol=0, atol=1e-5)


def test_auto_logs_its_candidates_on_this_cpu(caplog):
    import logging

    from embedl_dynamo.runtimes.registry import reset_runtimes

    reset_runtimes()  # forgets which candidates were logged
    with caplog.at_level(logging.INFO, logger="embedl_dynamo.runtimes.registry"):
        cls = runtime_candidates("auto")[0]
    if not RUNTIMES["tensorrt"].is_available():
        expected = OpenVINORuntime if OpenVINORuntime.is_available() else OnnxRuntime
        assert cls is expected
    assert f"runtime 'auto' selected {cls.name}" in caplog.text


def test_auto_picks_tensorrt_only_for_cuda_graphs(monkeypatch):
    from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

    monkeypatch.setattr(TensorRTRuntime, "missing", classmethod(lambda cls: None))
    monkeypatch.setattr(OpenVINORuntime, "missing", classmethod(lambda cls: "not installed"))
    assert runtime_candidates("auto", on_cuda=True)[0] is TensorRTRuntime
    assert runtime_candidates("auto", on_cuda=False)[0] is OnnxRuntime  # a CPU model stays on CPU
    assert runtime_candidates("auto")[0] is OnnxRuntime


def test_unknown_runtime_lists_valid_ones():
    match = "invalid runtime='tvm'; valid values: 'auto', 'onnxruntime', 'openvino', 'tensorrt'"
    with pytest.raises(ValueError, match=match):
        runtime_candidates("tvm")


@pytest.mark.parametrize("name", ["tensorrt", "torch_tensorrt"])
def test_unavailable_runtime_names_what_is_missing(name):
    cls = RUNTIMES[name]
    if cls.is_available():
        pytest.skip(f"{name} is available here")
    with pytest.raises(RuntimeUnavailableError, match=f"runtime '{name}' is unavailable: ") as e:
        runtime_candidates(name)
    assert any(w in str(e.value) for w in ("not installed", "CUDA", "fails to import", "version"))


@pytest.mark.tensorrt
@pytest.mark.cuda
@requires_tensorrt
def test_tensorrt_engine_matches_and_is_cached(transformed, tmp_path):
    model, gm, x = transformed
    rt = RUNTIMES["tensorrt"](_settings(tmp_path)).build(gm, [x])
    out = rt.infer(x.cuda())[0].cpu()
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-2, atol=1e-2)
    out5 = rt.infer(torch.randn(5, 3, 16, 16).cuda())[0]  # dynamic batch, same engine
    assert out5.shape[0] == 5
    again = RUNTIMES["tensorrt"](_settings(tmp_path)).build(gm, [x])
    assert again.from_cache and BUILD_COUNTS["trt_engine"] == 1


@pytest.mark.tensorrt
@pytest.mark.cuda
@requires_torch_tensorrt
def test_torch_tensorrt_matches(transformed, tmp_path):
    model, gm, x = transformed
    rt = RUNTIMES["torch_tensorrt"](_settings(tmp_path)).build(gm, [x])
    out = rt.infer(x.cuda())[0].cpu()
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-2, atol=1e-2)


@pytest.mark.tensorrt
@pytest.mark.cuda
@requires_tensorrt
def test_torch_compile_with_tensorrt_runtime():
    model = randomize_batchnorm(ResNetLike().eval()).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "tensorrt"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-2, atol=1e-2)
