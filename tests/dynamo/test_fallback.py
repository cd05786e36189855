"""What stays in PyTorch runs the *original* graph, and ops with layout semantics survive."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import fx, nn

import embedl_dynamo
import embedl_dynamo.dynamo.compile as dynamo_compile
import embedl_dynamo.tuning.precision_form as precision_form
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from tests.helpers import assert_close_to_scale


class _ShuffleBlock(nn.Module):
    """ShuffleNetV2-style: conv, then channel shuffle (transpose -> contiguous -> view)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        b, c, h, w = y.shape
        y = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return y.view(b, c, h, w)


def test_channel_shuffle_compiles_and_runs_on_the_runtime():
    model = _ShuffleBlock().eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_onnxruntime")(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason


def test_a_runtime_that_cannot_build_leaves_the_original_graph_running(monkeypatch):
    real = precision_form.run_pipeline

    def broken_pipeline(*args, **kwargs):
        result = real(*args, **kwargs)

        class Broken(fx.GraphModule):
            def forward(self, *a):
                raise AssertionError("the transformed graph must not run in the fallback")

        result.model = Broken(result.model, result.model.graph)
        return result

    def failing_build(self, gm, inputs, judge=None):
        raise RuntimeError("export failed: unsupported op")

    monkeypatch.setattr(precision_form, "run_pipeline", broken_pipeline)
    monkeypatch.setattr(OnnxRuntime, "build", failing_build)
    model = _ShuffleBlock().eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_onnxruntime")(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (
        sub.runtime == "eager" and "onnxruntime failed: RuntimeError: export failed" in sub.reason
    )


def test_a_rewrite_that_changes_the_results_fails_the_first_call(monkeypatch):
    """Regression (issue 23 item 3): the first-call check compared the artifact with the
    transformed graph, so a rewrite that broke the semantics passed it."""
    real = precision_form.run_pipeline

    def wrong_rewrite(*args, **kwargs):
        result = real(*args, **kwargs)
        graph = result.model.graph
        output = next(n for n in graph.nodes if n.op == "output")
        (first, *rest) = output.args[0]
        with graph.inserting_before(output):
            off = graph.call_function(torch.mul, (first, 1.5))
        output.args = ((off, *rest),)
        result.model.recompile()
        result.float_model = result.model
        return result

    monkeypatch.setattr(precision_form, "run_pipeline", wrong_rewrite)
    model = _ShuffleBlock().eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_onnxruntime")(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("eager", "eager")
    assert "differ" in sub.reason, sub.reason


def test_a_failure_inside_the_backend_runs_the_graph_in_pytorch_with_a_warning(monkeypatch):
    """ "Fallback, never a crash" (issue 23 item 11): an unexpected error in our own code runs
    the original graph, with one warning; fallback="raise" raises it."""

    def broken(*args, **kwargs):
        raise KeyError("an internal bug")

    monkeypatch.setattr(dynamo_compile, "freeze", broken)
    model = _ShuffleBlock().eval()
    x = torch.randn(2, 4, 8, 8)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        assert_close_to_scale(torch.compile(model, backend="embedl_onnxruntime")(x), model(x))
    assert sum("failed inside embedl_dynamo" in str(w.message) for w in caught) == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="embedl_onnxruntime", options={"fallback": "raise"})
    with pytest.raises(Exception, match="an internal bug"), torch.no_grad():
        compiled(x)


class _FloorDivide(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * 2 + 1) // b + a


def test_an_integer_division_by_a_tensor_stays_in_pytorch_quietly(capfd):
    """Regression (issue 39 item 10): an integer division by zero printed ONNX Runtime's red
    error line and FX's generated code to stderr. Integer ``//`` by a tensor now stays in
    PyTorch (ONNX Runtime's Div ends the process on the smallest int64 by -1): one warning at
    the compile, and a zero divisor raises PyTorch's own error, with nothing on stderr."""
    a, b = torch.randint(1, 9, (2, 4)), torch.randint(1, 3, (2, 4))
    zero = b.clone()
    zero[0, 0] = 0
    torch._dynamo.reset()
    compiled = torch.compile(_FloorDivide(), backend="embedl_onnxruntime")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        assert torch.equal(compiled(a, b), _FloorDivide()(a, b))
        capfd.readouterr()
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(a, zero)
    assert sum("integer division by -1" in str(w.message) for w in caught) == 1
    err = capfd.readouterr().err
    assert "[E:onnxruntime" not in err and "Traceback" not in err, err
