"""Python numbers in and out of a compiled graph: a float argument that changes is an input of
the artifact, a size among the outputs comes back as a Python ``int``; neither runs in PyTorch.
"""

from __future__ import annotations

import torch
from torch import nn

import embedl_dynamo
from tests.helpers import BUILD_COUNTS, assert_close_to_scale


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, bias=None, scale: float = 1.0) -> torch.Tensor:
        y = self.fc2(torch.relu(self.fc1(x))) * scale
        return y if bias is None else y + bias


class _ScaledInt(nn.Module):
    """A float scalar meets an integer tensor: PyTorch computes in the default float dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        positive = (self.fc2(torch.relu(self.fc1(x))) > 0).to(torch.int32)
        return positive * scale + x * scale


class _IntTimes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, n: int = 1) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * n + x * (n + 1)


class _WithBatchSize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        y = self.fc2(torch.relu(self.fc1(x)))
        return y, y.shape[0]


def _all_compiled() -> None:
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert subgraphs, "nothing was compiled"
    for sub in subgraphs:
        assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason
        assert "PyTorch" not in sub.reason, sub.reason


def test_a_float_argument_that_changes_is_an_input_of_the_artifact():
    model = _Scaled().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(4, 8)
    with torch.no_grad():
        for scale in (1.0, 2.0, 3.5, -0.25):
            assert_close_to_scale(compiled(x, scale=scale), model(x, scale=scale))
    _all_compiled()
    # the graph Dynamo specialised on 1.0, and the one taking the float: no build per value
    assert BUILD_COUNTS["onnx"] == 2


def test_a_float_argument_takes_the_dtype_pytorch_computes_in():
    model = _ScaledInt().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(4, 8)
    with torch.no_grad():
        for scale in (1.0, 2.1, 3.5):
            out, expected = compiled(x, scale=scale), model(x, scale=scale)
            assert out.dtype == expected.dtype
            assert_close_to_scale(out, expected)
    _all_compiled()


def test_an_int_argument_that_changes_is_an_input_of_the_artifact():
    model = _IntTimes().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(4, 8)
    with torch.no_grad():
        for n in (2, 3, 5, -7):
            assert_close_to_scale(compiled(x, n=n), model(x, n=n))
    _all_compiled()
    assert BUILD_COUNTS["onnx"] == 2  # specialised on 2, then the one taking the int


def test_a_batch_size_among_the_outputs_comes_back_as_an_int():
    model = _WithBatchSize().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        for batch in (2, 3, 5, 7):
            x = torch.randn(batch, 8)
            y, n = compiled(x)
            assert type(n) is int and n == batch
            assert_close_to_scale(y, model(x)[0])
    _all_compiled()
    # the static graph and the recompile returning the size share one artifact
    assert BUILD_COUNTS["onnx"] == 1


class _NormEps(nn.Module):
    """A float attribute read as a number (LayerNorm's eps, dropout's p), as HF models under
    ``dynamic=True``: Dynamo passes it as an input and reads it with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.p = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.norm(self.fc(x)), self.p, training=False)


def test_a_float_read_as_a_number_is_held_and_guarded_under_dynamic_true():
    """Regression (issue 23 item 14): under dynamic=True every float attribute became an input
    the exported file dropped ("expected 3 inputs, got 16"), so HF BERT ran in PyTorch. Such a
    float is now a constant of the artifact, and a call with another value runs the original
    graph."""
    torch.manual_seed(0)
    model = _NormEps().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 8)
            assert_close_to_scale(compiled(x), model(x))
        assert {s.runtime for s in embedl_dynamo.last_report().subgraphs} == {"onnxruntime"}
        model.norm.eps = 0.5  # the value the artifact holds changes: PyTorch's answer still
        x = torch.randn(4, 8) * 0.01
        assert_close_to_scale(compiled(x), model(x))
