"""A compiled artifact is judged on inputs its export did not trace, not on the build sample
alone: an artifact that answers every input as it answered that sample (a trace that folded
its inputs into a constant, as ``mixed``'s exports under the refit's weight recorder did) is
refused, never served."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from tests.models import TinyConvNet

G = torch.Generator().manual_seed(0)
X = torch.randn(2, 3, 8, 8, generator=G)
# calibration batches larger than the build's: judged on their first samples
BATCHES = [torch.randn(4, 3, 8, 8, generator=G) for _ in range(2)]


@pytest.fixture
def traced_input_only(monkeypatch):
    """ONNX Runtime answering every call as it answered its first (the build sample)."""
    real = OnnxRuntime._infer

    def first_answer(self, args):
        if not hasattr(self, "_first_answer"):
            self._first_answer = real(self, args)
        return self._first_answer

    monkeypatch.setattr(OnnxRuntime, "_infer", first_answer)


def _compile(precision: str, fallback: str, tmp_path):
    torch.manual_seed(0)
    model = TinyConvNet().eval()
    options = {
        "precision": precision,
        "calibration_data": BATCHES,
        "fallback": fallback,
        "cache_dir": str(tmp_path),
        "runtime": "onnxruntime",
    }
    return model, torch.compile(model, backend="embedl_onnxruntime", options=options)


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_an_artifact_right_on_the_build_sample_alone_is_refused(
    precision, traced_input_only, tmp_path
):
    """fp32: the served float artifact, on the calibration batches; mixed: its race's fp32
    candidate, before anything is timed against it."""
    _, compiled = _compile(precision, "raise", tmp_path)
    with pytest.raises(Exception, match="float artifact on judging batch 1"):
        with torch.no_grad():
            compiled(X)


def test_a_refused_artifact_leaves_the_graph_in_pytorch(traced_input_only, tmp_path):
    model, compiled = _compile("fp32", "eager", tmp_path)
    other = torch.randn(2, 3, 8, 8, generator=G)
    with torch.no_grad():
        compiled(X)
        torch.testing.assert_close(compiled(other), model(other))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.status == "eager" and "judging batch 1" in sub.reason
