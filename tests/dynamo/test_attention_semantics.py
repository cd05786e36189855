"""Attention under ``torch.compile`` keeps PyTorch's semantics (issue 23 items 14 and 15).

Under ``dynamic=True`` Dynamo turns a float ``scale`` attribute into a graph input read with
``.item()``; the artifact must take it as a runtime value, neither rejecting it nor baking in
the value it was traced with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from tests.helpers import assert_close_to_scale


class _ScaledAttention(nn.Module):
    """SDPA with a float ``scale`` attribute, between ops so the subgraph is worth compiling."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.3
        self.proj = nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(self.proj(q), k * 2, v, scale=self.scale)
        return out.relu()


def _heads(length: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(1, 2, length, 16) for _ in range(3))


def _assert_compiled() -> None:
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert subgraphs, "nothing was compiled"
    for sub in subgraphs:
        assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason


def test_sdpa_float_scale_attribute_under_dynamic_true_is_compiled_and_matches():
    torch.manual_seed(0)
    model = _ScaledAttention().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", dynamic=True)
    with torch.no_grad():
        for length in (8, 12):
            args = _heads(length)
            assert_close_to_scale(compiled(*args), model(*args))
            _assert_compiled()


def test_sdpa_scale_changed_after_compiling_is_read_at_run_time():
    """Dynamo does not guard an unspecialised float: a baked-in scale would be a silent wrong
    answer once the attribute changes."""
    torch.manual_seed(0)
    model = _ScaledAttention().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", dynamic=True)
    args = _heads(8)
    with torch.no_grad():
        compiled(*args)
        model.scale = 0.05
        assert_close_to_scale(compiled(*args), model(*args))
