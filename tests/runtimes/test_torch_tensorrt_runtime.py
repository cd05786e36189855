"""The ``torch_tensorrt`` runtime, proven on CPU with a recording stand-in for Torch-TensorRT's
Dynamo backend: no ``torch.export`` inside our backend, the engine-cache options that make its
cache engage, one module per input shape, and INT8 only through ``tensorrt::quantize_op``."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo import quantize
from embedl_dynamo.backend import as_backend
from embedl_dynamo.runtimes.torch_tensorrt import runtime as trt_runtime
from embedl_dynamo.runtimes.torch_tensorrt.runtime import MAX_SHAPES, TorchTensorRTRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.transform import transform
from tests.models import ResNetLike, randomize_batchnorm


@pytest.fixture
def stand_in(monkeypatch):
    """Torch-TensorRT's backend replaced by a recorder that returns the graph's forward."""
    calls = []

    def backend(gm, inputs, options):
        calls.append({"shapes": [tuple(t.shape) for t in inputs], "options": dict(options)})
        return gm.forward

    def no_export(*args, **kwargs):
        raise AssertionError("torch.export.export must not run inside a Dynamo backend")

    monkeypatch.setattr(trt_runtime, "torch_tensorrt_backend", lambda: backend)
    monkeypatch.setattr(trt_runtime, "target_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(TorchTensorRTRuntime, "missing", classmethod(lambda cls: None))
    monkeypatch.setattr(torch.export, "export", no_export)
    return calls


def _graph():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    target = as_backend("tensorrt")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    return model, transform(model, (x,), patterns).model, x


def test_hands_the_graph_to_the_dynamo_backend_with_cache_options(stand_in, tmp_path):
    model, gm, x = _graph()
    settings = Settings(cache_dir=tmp_path, min_subgraph_size=4)
    runtime = TorchTensorRTRuntime(settings).build(gm, [x])
    (call,) = stand_in
    assert call["shapes"] == [(2, 3, 16, 16)]
    assert call["options"] == {
        "pass_through_build_failures": True,
        "min_block_size": 4,
        "cache_built_engines": True,
        "reuse_cached_engines": True,
        "engine_cache_dir": str(tmp_path / "torch_tensorrt"),
        "immutable_weights": False,
    }
    with torch.no_grad():
        (y,) = runtime.infer(x)
        assert torch.allclose(y, model(x), atol=1e-4)


def test_a_new_shape_builds_one_more_module_up_to_a_limit(stand_in, tmp_path):
    _, gm, x = _graph()
    runtime = TorchTensorRTRuntime(Settings(cache_dir=tmp_path)).build(gm, [x])
    runtime.infer(x)  # same shape: no new build
    runtime.infer(torch.randn(5, 3, 16, 16))
    assert [c["shapes"][0][0] for c in stand_in] == [2, 5]
    for batch in range(6, 6 + MAX_SHAPES - 2):
        runtime.infer(torch.randn(batch, 3, 16, 16))
    with pytest.raises(RuntimeError, match=f"engines for {MAX_SHAPES} input shapes"):
        runtime.infer(torch.randn(99, 3, 16, 16))


def test_int8_without_modelopt_is_a_clear_error(stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(trt_runtime, "has_quantize_op", lambda: False)
    model, _, x = _graph()
    fake_quant = quantize(model, (x,), backend="tensorrt", calibration_data=[x])
    with pytest.raises(RuntimeError, match="pip install nvidia-modelopt"):
        TorchTensorRTRuntime(Settings(cache_dir=tmp_path)).build(fake_quant, [x])
    assert not stand_in  # nothing handed to Torch-TensorRT


def test_int8_with_modelopt_hands_over_the_quantize_op_form(stand_in, tmp_path, monkeypatch):
    converted = []

    def to_quantize_op(gm):
        converted.append(gm)
        return gm  # the stand-in runs the fake-quant graph itself

    monkeypatch.setattr(trt_runtime, "has_quantize_op", lambda: True)
    monkeypatch.setattr(trt_runtime, "to_torch_tensorrt_qdq", to_quantize_op)
    model, _, x = _graph()
    fake_quant = quantize(model, (x,), backend="tensorrt", calibration_data=[x])
    TorchTensorRTRuntime(Settings(cache_dir=tmp_path)).build(fake_quant, [x])
    assert converted and len(stand_in) == 1


@pytest.mark.parametrize("batch", [1, 2])
def test_torch_compile_flow_reaches_the_backend_without_torch_export(stand_in, batch):
    """Defect 1 (torch.export inside a Dynamo backend: guard failure at batch 2, constraint
    violation at batch 1) is caught here: the stand-in sits at the exact call boundary and
    ``torch.export.export`` raises if anything calls it."""
    import embedl_dynamo

    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(
        model, backend="embedl_tensorrt", options={"runtime": "torch_tensorrt", "fallback": "raise"}
    )
    x = torch.randn(batch, 3, 16, 16)
    with torch.no_grad():
        got, want = compiled(x), model(x)
        again = compiled(torch.randn(batch + 3, 3, 16, 16))  # a new batch: one more build
    (sub, *rest) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "torch_tensorrt" and not sub.reason
    assert torch.allclose(got, want, atol=1e-4)
    assert again.shape[0] == batch + 3
    assert {c["shapes"][0][0] for c in stand_in} == {batch, batch + 3}
    assert all(c["options"]["immutable_weights"] is False for c in stand_in)
