"""Every axis Dynamo makes symbolic stays dynamic in the artifact; nothing escapes a runtime.

Dynamo compiles a static graph first, then once more with the axes that changed made symbolic.
After that recompile a new size must reuse the artifact (count the builds) and match eager.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.runtimes.artifacts import BUILD_COUNTS
from embedl_dynamo.runtimes.onnxruntime import OnnxRuntime
from tests.helpers import assert_close_to_scale
from tests.models import randomize_batchnorm


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))))


class _TokenMixer(nn.Module):
    """A sequence model: the sequence axis reaches the output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.relu(self.fc1(x))))


class _TwoBatches(nn.Module):
    """Two inputs whose first dims differ (a pair of independent batches)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x)).sum(0) + torch.relu(self.b(y)).sum(0)


def _run(model: nn.Module, calls: list[tuple[torch.Tensor, ...]]) -> None:
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        for args in calls:
            assert_close_to_scale(compiled(*args), model(*args))


def test_image_size_that_changes_stays_dynamic_and_builds_twice():
    model = randomize_batchnorm(_ConvNet().eval())
    sizes = (16, 20, 16, 24, 12)
    _run(model, [(torch.randn(1, 3, s, s),) for s in sizes])
    assert BUILD_COUNTS["onnx"] == 2  # the static graph and the symbolic recompile, then none


def test_sequence_length_that_changes_stays_dynamic_and_builds_twice():
    model = _TokenMixer().eval()
    _run(model, [(torch.randn(2, n, 16),) for n in (5, 9, 5, 13, 32, 48, 64, 80)])
    assert BUILD_COUNTS["onnx"] == 2


def test_two_inputs_with_different_batch_sizes():
    model = _TwoBatches().eval()
    _run(
        model, [(torch.randn(a, 6), torch.randn(b, 6)) for a, b in ((4, 7), (7, 4), (5, 5), (9, 3))]
    )


def test_a_call_the_runtime_cannot_take_runs_the_original_graph(monkeypatch, caplog):
    model = _TokenMixer().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)

        def _fail(self, args):
            raise RuntimeError("INVALID_ARGUMENT : Got invalid dimensions for input: input_0")

        monkeypatch.setattr(OnnxRuntime, "_infer", _fail)
        with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
            assert_close_to_scale(compiled(x), model(x))
            assert_close_to_scale(compiled(x), model(x))
    warnings = [r for r in caplog.records if "failed on a call" in r.getMessage()]
    assert len(warnings) == 1 and "invalid dimensions" in warnings[0].getMessage()
    assert "some calls ran in PyTorch" in embedl_dynamo.last_report().subgraphs[0].reason


def test_fallback_raise_lets_a_call_failure_through(monkeypatch):
    model = _TokenMixer().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", options={"fallback": "raise"})
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)

        def _fail(self, args):
            raise RuntimeError("boom")

        monkeypatch.setattr(OnnxRuntime, "_infer", _fail)
        with pytest.raises(RuntimeError, match="boom"):
            compiled(x)
