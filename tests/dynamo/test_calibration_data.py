"""INT8 asked for is INT8 delivered, or a clear error: never float eager in silence."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.quant.int8 import stage
from tests.models import TinyConvNet

X = torch.randn(2, 3, 8, 8)


def _int8(model: nn.Module, data, **options):
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={"quantize": "int8", "calibration_data": data, **options},
    )
    with torch.no_grad():
        return compiled(X)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([torch.full((2, 3, 8, 8), float("nan"))], "non-finite values"),
        ([], "calibration_data is empty"),
        (lambda m: (_ for _ in ()).throw(OSError("loader gone")), "forward_loop raised OSError"),
    ],
)
def test_bad_calibration_data_is_a_clear_error(data, message):
    with pytest.raises(Exception, match=message):
        _int8(TinyConvNet().eval(), data)


def test_a_generator_serves_every_compile():
    batches = (torch.randn(2, 3, 8, 8) for _ in range(2))
    _int8(TinyConvNet().eval(), batches)
    torch._dynamo.reset()
    embedl_dynamo.clear_reports()
    _int8(TinyConvNet().eval(), batches)  # the same generator object, reused
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.pipeline["quantized"] and sub.runtime == "onnxruntime"


def test_a_failed_cache_write_still_builds_int8_and_warns(monkeypatch, caplog, tmp_path):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stage, "store_ranges", no_space)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _int8(TinyConvNet().eval(), [torch.randn(2, 3, 8, 8)], cache_dir=tmp_path)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.pipeline["quantized"] and "not cached" in caplog.text


class _Broken(nn.Module):
    """A graph break: the second subgraph sees (2, 4) features, not the (2, 3, 8, 8) images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean((2, 3))
        torch._dynamo.graph_break()
        return self.fc2(torch.relu(self.fc1(y)))


def test_a_subgraph_after_a_graph_break_calibrates_on_what_reaches_it(caplog):
    model = _Broken().eval()
    data = [torch.randn(2, 3, 8, 8) for _ in range(2)]
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={
            "quantize": "int8",
            "calibration_data": data,
            "calibration_steps": 2,
            "min_subgraph_size": 1,
        },
    )
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"), torch.no_grad():
        for _ in range(3):
            compiled(X)
    assert any("does not fit its inputs" in r.getMessage() for r in caplog.records)
    subs = embedl_dynamo.last_report().subgraphs
    assert subs[0].pipeline["quantized"]  # the first subgraph used the batches it was given
    assert all(s.runtime == "onnxruntime" for s in subs)


@pytest.mark.parametrize(
    ("backend", "runtime"), [("embedl_openvino", "onnxruntime"), ("embedl_onnxruntime", "openvino")]
)
def test_int8_on_another_targets_runtime_says_it_calibrates_then_runs_int8(backend, runtime):
    """Regression (issue 39 item 5): the calls that calibrate ran in PyTorch while the report
    said "compiled on eager" with no reason, as if INT8 had been dropped silently."""
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU()).eval()
    options = {"runtime": runtime, "precision": "int8", "calibration_steps": 2}
    compiled = torch.compile(model, backend=backend, options=options)
    with torch.no_grad():
        compiled(torch.randn(2, 3, 12, 12))
        (sub,) = embedl_dynamo.last_report().subgraphs
        assert sub.runtime == "eager" and "calibrates on the first 2 calls" in sub.reason
        for _ in range(2):
            compiled(torch.randn(2, 3, 12, 12))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", runtime), sub.reason
    assert "calibrates" not in sub.reason
    assert sub.pipeline.get("quantized") or sub.pipeline.get("precision") == "int8"
