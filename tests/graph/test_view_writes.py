"""Writes through views, and outputs that are views, beyond the idiom table of
``test_inplace_idioms.py`` (issue 39 item 9): each compiles on ONNX Runtime and equals eager,
outputs, inputs and buffers included, on two calls in a row."""

from __future__ import annotations

import warnings

import pytest
import torch

import embedl_dynamo
from tests.graph.test_inplace_idioms import Idiom


def _y(x):
    return x * 2 + 0.5


def _iadd_slice(s, x):
    y = _y(x)
    y[:, 1:3] += 1
    return y


def _split_zero(s, x):
    y = _y(x)
    y.split([2, 2])[1].zero_()
    return y * 1


def _input_unsqueeze_mul(s, x):
    x.unsqueeze(0).mul_(2)
    return x * 3 + 1


def _written_view_and_base(s, x):
    y = _y(x)
    return y[0].add_(1), y


def _transpose_attribute(s, x):
    y = _y(x)
    y.T.add_(1)
    return y


def _base_then_view_written(s, x):
    y = _y(x)
    y.add_(1)
    y[1].mul_(2)
    return y * 1


def _view_read_between(s, x):
    y = _y(x)
    row = y[2]
    y[2:].mul_(2)
    return row + 1, y.sum()


def _buffer_view_written(s, x):
    s.b[2:4].add_(x[0, :2])
    return _y(x), s.b * 1


def _input_view_of_view(s, x):
    x[1:].t()[0].fill_(5.0)
    return x + 1


def _masked_view(s, x):
    y = _y(x)
    y[1:].masked_fill_(y[1:] > 1, 0.0)
    return y


BODIES = [
    _iadd_slice,
    _split_zero,
    _input_unsqueeze_mul,
    _written_view_and_base,
    _transpose_attribute,
    _base_then_view_written,
    _view_read_between,
    _buffer_view_written,
    _input_view_of_view,
    _masked_view,
]


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("body", BODIES, ids=lambda f: f.__name__.strip("_"))
def test_view_write_compiles_and_equals_eager(body):
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    x_eager = x.clone()
    model, reference = Idiom(body).eval(), Idiom(body).eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            got, want = _tuple(compiled(x)), _tuple(reference(x_eager))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
            torch.testing.assert_close(x, x_eager, rtol=0, atol=1e-5)
            torch.testing.assert_close(model.b, reference.b, rtol=0, atol=1e-5)
    runtimes = [s.runtime for s in embedl_dynamo.last_report().subgraphs]
    assert runtimes == ["onnxruntime"], embedl_dynamo.last_report()
