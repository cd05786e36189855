"""A NaN on the call that compiles a subgraph (issue 50 item 7): an INT8 artifact a warm start
loads (another process, or Dynamo's recompile for an inference-mode tensor) refuses NaN and
infinity as a freshly built one does, and a good lower-precision entry is not forgotten because
the first call it is loaded on holds a NaN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from tests.helpers import assert_close_to_scale

torch.manual_seed(0)
CALIBRATION = [(torch.randn(2, 3, 16, 16),) for _ in range(4)]
CLEAN = torch.randn(2, 3, 16, 16)
WITH_NAN = CLEAN.clone()
WITH_NAN[0, 0, 3, 3] = float("nan")  # one NaN in sample 0


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


def _compiled(model: nn.Module, backend: str, **options):
    options = {"precision": "int8", "calibration_data": CALIBRATION, **options}
    return torch.compile(model, backend=f"embedl_{backend}", options=options)


def _assert_eagers_answer(out: torch.Tensor, model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        want = model(x)
    assert torch.equal(out.isnan(), want.isnan()), "NaN exactly where PyTorch gives it"
    assert_close_to_scale(out[1], want[1], rtol=0.1)  # the clean sample, at INT8's precision


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_recompile_for_an_inference_tensor_with_a_nan_gives_nan(backend):
    model = _model()
    compiled = _compiled(model, backend)
    with torch.no_grad():
        for _ in range(2):
            compiled(torch.randn(2, 3, 16, 16))
    with torch.inference_mode():
        x = WITH_NAN.clone()
    with torch.no_grad():
        out = compiled(x)  # a new graph for the inference tensor: built on this call
    last = embedl_dynamo.last_report().subgraphs[-1]
    assert last.runtime == backend and last.pipeline.get("quantized")
    _assert_eagers_answer(out, model, WITH_NAN)


def test_another_process_whose_first_call_holds_a_nan_gives_nan():
    model = _compiled_once("onnxruntime")
    torch._dynamo.reset()  # as a new process: the warm start loads the INT8 artifact
    with torch.no_grad():
        out = _compiled(model, "onnxruntime")(WITH_NAN)
    (report,) = embedl_dynamo.last_report().subgraphs
    assert report.loaded and report.pipeline.get("quantized")
    _assert_eagers_answer(out, model, WITH_NAN)
    with torch.no_grad():  # later calls without NaN still run the INT8 artifact
        assert_close_to_scale(_compiled(model, "onnxruntime")(CLEAN), model(CLEAN), rtol=0.1)


def _compiled_once(backend: str, **options) -> nn.Module:
    model = _model()
    with torch.no_grad():
        _compiled(model, backend, **options)(CLEAN)
    embedl_dynamo.wait_for_cache_writes(timeout=60)
    return model


def test_a_nan_first_call_keeps_a_good_fp16_entry():
    model = _compiled_once("onnxruntime", precision="fp16", calibration_data=None)
    (built,) = embedl_dynamo.last_report().subgraphs
    assert "rejected" not in built.reason
    torch._dynamo.reset()
    embedl_dynamo.clear_reports()
    with torch.no_grad():
        _compiled(model, "onnxruntime", precision="fp16", calibration_data=None)(WITH_NAN)
    (loaded,) = embedl_dynamo.last_report().subgraphs
    assert loaded.cached and loaded.loaded, loaded.reason  # not forgotten, nor rebuilt in fp32
    assert loaded.runtime_info["key"] == built.runtime_info["key"]
