"""``a.copy_(b)`` then an in-place write into ``b`` (issue 39 item 10): ``a`` keeps the copy,
as in eager. It raised an internal ``KeyError: type_as``, and the functional form of
``copy_`` shared ``b``'s memory, so ``b.zero_()`` zeroed ``a`` as well."""

from __future__ import annotations

import torch
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo.graph.functionalize import functionalize


class _CopyThenZero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        b = x + 1
        a.copy_(b)
        b.zero_()
        return a * 3 + b


class _CopyInputs(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.copy_(b)
        b.zero_()
        return a * 2 + b + 1


def test_functionalize_keeps_the_copy_apart_from_its_source():
    gm = fx.symbolic_trace(_CopyThenZero())
    x = torch.randn(2, 4)
    assert functionalize(gm, write_back=True) == ()
    assert torch.equal(gm(x), _CopyThenZero()(x))


def test_copy_then_zero_compiles_equal_to_eager():
    x = torch.randn(2, 4)
    with torch.no_grad():
        actual = torch.compile(_CopyThenZero(), backend="embedl_onnxruntime")(x)
    assert torch.equal(actual, _CopyThenZero()(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason


def test_copy_into_an_input_then_zero_another_matches_eager():
    """``b.zero_()`` on an input has no out-of-place form: the graph runs in PyTorch, and the
    outputs and both inputs end as eager leaves them."""
    a, b = torch.randn(2, 4), torch.randn(2, 4)
    a1, b1, a2, b2 = a.clone(), b.clone(), a.clone(), b.clone()
    expected = _CopyInputs()(a1, b1)
    with torch.no_grad():
        actual = torch.compile(_CopyInputs(), backend="embedl_onnxruntime")(a2, b2)
    assert torch.equal(actual, expected)
    assert torch.equal(a2, a1) and torch.equal(b2, b1)
