"""Values PyTorch defines exactly survive every target: floor division of negative numbers
(issue 23 item 4) and NaN / infinity in the outputs (item 8)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS, COMMON_FUSION_PATTERNS

TARGETS = ["onnxruntime", "tensorrt", "openvino", "lattice"]


class FloorDivision(nn.Module):
    """``//`` on integer and float tensors, in three spellings."""

    def forward(self, x):
        i = (x * 10).long()
        thrice = i + i + i  # sums, not products: OpenVINO keeps integer products in PyTorch
        return thrice // 2, torch.floor_divide(thrice + i + i, 3), (x * 7) // 2.0 + 1


class NonFinite(nn.Module):
    """``log(0)`` is -inf and ``sqrt`` of a negative number NaN, in eager and in the artifact."""

    def forward(self, x):
        y = torch.relu(x * 2)
        return torch.log(y) + 1, torch.sqrt(x - 0.5) * 2


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
def test_floor_division_rounds_towards_minus_infinity(target, compile_isolation):
    model = FloorDivision().eval()
    compiled = torch.compile(model, backend=f"embedl_{target}")
    with torch.no_grad():
        compiled(torch.rand(4, 5))  # the first call sees non-negative values only
        x = -torch.rand(4, 5) - 0.05
        _same(compiled(x), model(x))
    assert "eager" not in {s.runtime for s in embedl_dynamo.last_report().subgraphs}


def test_floor_division_through_transform():
    model = FloorDivision().eval()
    patterns = [*COMMON_CONVERSION_PATTERNS, *COMMON_FUSION_PATTERNS]
    result = embedl_dynamo.transform(model, (torch.rand(4, 5),), patterns)
    x = -torch.rand(4, 5) - 0.05
    with torch.no_grad():
        _same(result.model(x), model(x))


@pytest.mark.parametrize("target", TARGETS)
def test_nan_and_infinity_where_eager_has_them_compile(target, compile_isolation):
    """Regression: a first-call output with NaN/inf where eager has the same was rejected
    ("differs by nan") and the graph ran in PyTorch for good."""
    model = NonFinite().eval()
    x = torch.randn(4, 6)
    assert model(x)[0].isinf().any() and model(x)[1].isnan().any()
    compiled = torch.compile(model, backend=f"embedl_{target}")
    with torch.no_grad():
        _same(compiled(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime != "eager", sub.reason
