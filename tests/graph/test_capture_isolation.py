"""Each capture of :func:`~embedl_dynamo.graph.capture.capture` is independent of the captures
before it in the process.

Dynamo remembers, per code object name and place, the sizes and float attributes each call
saw, and makes those that changed symbolic on the next ("automatic dynamic"). Every capture
enters through the same code, so without care an export with another sequence length than the
one before gets a symbolic length, and one of a model whose ``eps`` differs gets the float as an
input of the graph.
"""

from __future__ import annotations

import threading

import torch
from torch import fx, nn

from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.nodes import node_value_meta


class _Norm(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _input_shapes(gm: fx.GraphModule) -> list[tuple[object, ...]]:
    return [tuple(node_value_meta(n).shape) for n in gm.graph.nodes if n.op == "placeholder"]


def _symbolic(shape: tuple[object, ...]) -> list[int]:
    return [i for i, size in enumerate(shape) if not isinstance(size, int)]


def test_a_capture_after_another_length_keeps_its_length_static():
    model = _Norm(1e-6).eval()
    capture(model, (torch.randn(2, 12, 8),), dynamic_batch=True)
    gm = capture(model, (torch.randn(2, 16, 8),), dynamic_batch=True)
    assert [_symbolic(s) for s in _input_shapes(gm)] == [[0]]


def test_a_capture_after_another_eps_keeps_the_float_a_constant():
    capture(_Norm(1e-6).eval(), (torch.randn(2, 4, 8),), dynamic_batch=True)
    model = _Norm(1e-5).eval()
    x = torch.randn(2, 4, 8)
    gm = capture(model, (x,), dynamic_batch=True)
    assert len(_input_shapes(gm)) == 1  # x alone: no tensorified eps
    torch.testing.assert_close(gm(x)[0], model(x), atol=0, rtol=0)


class _SetsUpOnFirstCall(nn.Module):
    """As transformers' output hooks: installed on the first call, under a lock (a context
    manager Dynamo does not enter)."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self.ready = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            with self._lock:
                self.ready = True
        return x.reshape(x.shape[0], -1).relu()


def test_a_model_that_sets_itself_up_on_its_first_call_keeps_a_symbolic_batch():
    gm = capture(_SetsUpOnFirstCall().eval(), (torch.randn(2, 3, 4),), dynamic_batch=True)
    assert [_symbolic(s) for s in _input_shapes(gm)] == [[0]]
    torch.testing.assert_close(gm(torch.randn(5, 3, 4))[0].shape, torch.Size([5, 12]))
