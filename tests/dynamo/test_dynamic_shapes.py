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
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from tests.helpers import BUILD_COUNTS, assert_close_to_scale
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
    """Each call matches eager, and ran in an ONNX Runtime artifact: the eager fallback gives
    the same outputs, so every subgraph must report compiled, on onnxruntime, no call in PyTorch."""
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        for args in calls:
            assert_close_to_scale(compiled(*args), model(*args))
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert subgraphs, "nothing was compiled"
    for sub in subgraphs:
        assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason
        assert "PyTorch" not in sub.reason, sub.reason


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
    assert BUILD_COUNTS["onnx"] == 2


def test_a_call_the_runtime_cannot_take_runs_the_original_graph(monkeypatch, caplog):
    model = _TokenMixer().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)

        def _fail(self, *args):
            raise RuntimeError("INVALID_ARGUMENT : Got invalid dimensions for input: input_0")

        monkeypatch.setattr(OnnxRuntime, "infer", _fail)
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

        def _fail(self, *args):
            raise RuntimeError("boom")

        monkeypatch.setattr(OnnxRuntime, "infer", _fail)
        with pytest.raises(RuntimeError, match="boom"):
            compiled(x)


class _TwoOutputs(nn.Module):
    """Two inputs, one output each: the second input's dim 0 never changes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.a(x)) * 2.0, torch.tanh(self.b(y)) + 1.0


def _input_dims(path: str) -> list[list[str | int]]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]


def test_a_static_dim_beside_a_symbolic_batch_is_not_tied_to_it(caplog):
    """x's batch goes 3 -> 4 -> 5 while y's dim 0 stays 4. At the recompile (x=4, y=4) Dynamo
    makes x's batch symbolic and keeps y's dim 0 static; naming both ``batch`` because they
    were equal then made ONNX Runtime reject (5, 4) and every such call ran in PyTorch."""
    model = _TwoOutputs().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for bx in (3, 4, 5, 6):
            x, y = torch.randn(bx, 6), torch.randn(4, 6)
            for got, want in zip(compiled(x, y), model(x, y)):
                assert_close_to_scale(got, want)
    assert "run in PyTorch" not in caplog.text
    symbolic = embedl_dynamo.last_report().subgraphs[-1]
    embedl_dynamo.wait_for_cache_writes()
    assert _input_dims(symbolic.runtime_info["artifact"]) == [["batch", 6], [4, 6]]
    assert BUILD_COUNTS["onnx"] == 2


class _SelfAttention(nn.Module):
    """BERT-style attention: the sequence length is used as a value in ``view``/``reshape``."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, dim // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (dim // self.heads) ** 0.5
        attended = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, length, dim)
        return self.norm(x + self.out(attended))


def test_attention_sequence_lengths_32_to_80_run_in_the_artifact(caplog):
    """Lengths 32, 48, 64, 80: two builds, and no call quietly falls back to PyTorch."""
    model = _SelfAttention().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for length in (32, 48, 64, 80, 48, 7):
            x = torch.randn(2, length, 32)
            assert_close_to_scale(compiled(x), model(x))
    assert "run in PyTorch" not in caplog.text
    assert BUILD_COUNTS["onnx"] == 2
    embedl_dynamo.wait_for_cache_writes()
    dims = _input_dims(embedl_dynamo.last_report().subgraphs[-1].runtime_info["artifact"])
    assert dims[0][0] == "batch" and isinstance(dims[0][1], str) and dims[0][2] == 32
