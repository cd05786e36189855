"""The exact forms of :mod:`embedl_dynamo.graph.exact_ops` compute what PyTorch computes, in
PyTorch (their exports are checked on the runtimes by tests/runtimes/test_later_calls.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph import exact_ops
from embedl_dynamo.graph.exact_ops import EXACT_FUNCTIONS, exact_lowering

NAN, INF = float("nan"), float("inf")
X = torch.tensor([[0.0, NAN, 5.0, 3.0], [1.0, 2.0, 2.0, -INF], [-INF, -INF, -INF, -INF]])
INTS = torch.tensor([[2**53, 1, 1], [3, -4, 5]])


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.nan_to_num(7, 8, 9), y.nan_to_num(7, 8, 9))
        assert torch.equal(torch.isnan(x), torch.isnan(y))


CALLS = [
    (torch.argmax, (X,), {}),
    (torch.argmax, (X, 1), {}),
    (torch.argmin, (X, 0, True), {}),
    (torch.argmax, (torch.tensor(3.0), 0), {}),
    (torch.max, (X,), {}),
    (torch.max, (X, 1), {}),
    (torch.min, (X,), {"dim": 0, "keepdim": True}),
    (torch.max, (X, X.flip(0)), {}),
    (torch.amax, (X, 1), {}),
    (torch.amin, (X, (0, 1)), {}),
    (torch.amax, (X, (), True), {}),
    (torch.maximum, (X, X.flip(1)), {}),
    (torch.sum, (INTS,), {}),
    (torch.sum, (INTS, 1), {}),
    (torch.sum, (INTS, (0, 1), True), {}),
    (torch.sum, (torch.zeros(0, 3, dtype=torch.int32), 0), {}),
    (torch.sum, (torch.tensor([True, True, False]),), {}),
    (torch.sum, (X, 1), {}),
    (F.softmax, (X,), {"dim": 1}),
    (F.log_softmax, (X, 0), {}),
    (F.max_pool2d, (X.reshape(1, 1, 3, 4), 2), {}),
    ("expand", (torch.tensor(3.0), ()), {}),
    ("expand", (torch.tensor([3.0]), 2, 1), {}),
    ("expand_as", (torch.tensor(3.0), torch.tensor(2.0)), {}),
    ("expand_as", (torch.tensor(3.0), X), {}),
    (F.normalize, (torch.tensor(-2.5),), {"p": 1.2, "dim": 0}),
    (F.normalize, (torch.tensor(-0.0), 2.0, -1), {}),
    (F.normalize, (torch.tensor(INF), 1.0, 0), {}),
    (F.normalize, (torch.tensor(NAN),), {"dim": 0}),
    (F.normalize, (X,), {}),  # not 0-d: F.normalize itself
]


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    CALLS,
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", ""),
)
def test_exact_form_matches_pytorch(fn, args, kwargs):
    eager = getattr(args[0], fn) if isinstance(fn, str) else fn  # a Tensor method
    rest = args[1:] if isinstance(fn, str) else args
    _same(eager(*rest, **kwargs), EXACT_FUNCTIONS[fn](*args, **kwargs))


def test_attention_gives_zeros_to_fully_masked_rows():
    q = torch.randn(1, 2, 4, 8)
    mask = torch.zeros(4, 4)
    mask[1] = -INF
    expected = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    _same(expected, exact_ops.exact_attention(q, q, q, attn_mask=mask))


def test_lowering_replaces_functions_and_methods_in_a_copy():
    gm = fx.symbolic_trace(lambda x: (torch.argmax(x, 1), x.amax(0), x.relu()))
    lowered = exact_lowering(gm)
    targets = {n.target for n in lowered.graph.nodes if n.op == "call_function"}
    assert exact_ops.exact_argmax in targets and torch.argmax not in targets
    assert any(n.target == "amax" for n in gm.graph.nodes)  # the original is left alone
    _same(gm(X), lowered(X))
    relu_only = fx.symbolic_trace(lambda x: x.relu())
    assert exact_lowering(relu_only) is relu_only


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_rms_norm_is_pytorchs_to_the_bit(dtype):
    """``rms_norm`` has no ONNX form at the opset used; its exact form is PyTorch's formula,
    equal to ``F.rms_norm`` bit for bit: each weight (none, the input's dtype, float32), ``eps``
    (None: the machine epsilon), one or two normalized axes, NaN and infinities."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 4, 64, generator=gen) * 3).to(dtype)
    x[0, 0, 0], x[0, 1, 3], x[1, 2, 5] = NAN, INF, -0.0
    for shape in ((64,), (4, 64)):
        for weight in (None, torch.randn(shape, generator=gen).to(dtype), torch.randn(shape)):
            for eps in (None, 1e-6):
                expected = F.rms_norm(x, shape, weight, eps)
                actual = exact_ops.exact_rms_norm(x, shape, weight, eps)
                assert actual.dtype == expected.dtype
                assert torch.equal(actual.nan_to_num(), expected.nan_to_num())
                assert torch.equal(actual.isnan(), expected.isnan())
                assert torch.equal(actual.signbit(), expected.signbit())


def test_rms_norm_is_lowered_by_its_torch_function():
    """Dynamo records ``nn.RMSNorm`` and ``F.rms_norm`` as ``torch.rms_norm``."""

    class Norm(torch.nn.RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    norm = Norm(8, eps=1e-5).eval()
    lowered = exact_lowering(fx.symbolic_trace(norm))
    targets = {n.target for n in lowered.graph.nodes if n.op == "call_function"}
    assert targets == {exact_ops.exact_rms_norm}
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(lowered(x), F.rms_norm(x, (8,), norm.weight, 1e-5))
