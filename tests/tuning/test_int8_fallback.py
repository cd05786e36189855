"""An INT8 artifact is judged against the float model; when it fails, the *float artifact* runs
(never the fake-quant graph in PyTorch), with a warning naming the subgraph and the error."""

from __future__ import annotations

import logging

import pytest
import torch

import embedl_dynamo
from tests.helpers import assert_close_to_scale
from tests.models import ResNetLike, randomize_batchnorm

G = torch.Generator().manual_seed(0)
BATCHES = [torch.randn(2, 3, 16, 16, generator=G) for _ in range(3)]


def _compile(**options):
    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={"quantize": "int8", "calibration_data": BATCHES, **options},
    )
    return model, compiled


def test_int8_within_the_budget_runs_int8():
    model, compiled = _compile()
    with torch.no_grad():
        y, want = compiled(BATCHES[0]), model(BATCHES[0])
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime" and sub.pipeline["quantized"] and not sub.reason
    cosine = torch.nn.functional.cosine_similarity(y.flatten(), want.flatten(), dim=0)
    assert cosine >= 0.99
    assert float((y - want).abs().max()) > 1e-5  # really INT8, not float


def test_int8_outside_the_budget_runs_the_float_artifact(caplog):
    model, compiled = _compile(accuracy_budget=1.0)  # no INT8 artifact is that exact
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"), torch.no_grad():
        y, want = compiled(BATCHES[0]), model(BATCHES[0])
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime" and "int8 rejected, fp32 runs: " in sub.reason
    assert "< accuracy_budget 1" in sub.reason
    assert_close_to_scale(y, want)  # float accuracy: the float artifact, not fake-quant
    (warning,) = [
        r for r in caplog.records if "int8 onnxruntime artifact rejected" in r.getMessage()
    ]
    assert "subgraph 0" in warning.getMessage() and "float artifact" in warning.getMessage()


@pytest.mark.parametrize("budget", [0, 1.5, "high", True])
def test_accuracy_budget_is_validated(budget):
    with pytest.raises(ValueError, match="invalid accuracy_budget"):
        embedl_dynamo.settings.Settings(accuracy_budget=budget)
