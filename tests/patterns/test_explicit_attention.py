"""ExplicitAttention: ``softmax(q k^T * scale [+ mask]) v`` written out becomes one SDPA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.backend import backend_by_name
from embedl_dynamo.patterns.conversions import RemoveDropout
from embedl_dynamo.patterns.explicit_attention import EXPLICIT_ATTENTION_PATTERNS

SCALE = 8**-0.5


class _Attention(nn.Module):
    """Attention as transformers' ``eager_attention_forward`` writes it (Llama's, GPT-2's)."""

    def __init__(self, masked: bool, softmax_dim: int = -1, return_probs: bool = False) -> None:
        super().__init__()
        self.masked, self.softmax_dim, self.return_probs = masked, softmax_dim, return_probs

    def forward(self, q, k, v, mask=None):
        scores = torch.matmul(q, k.transpose(2, 3)) * SCALE
        if self.masked:
            scores = scores + mask
        probs = nn.functional.softmax(scores, dim=self.softmax_dim, dtype=torch.float32)
        probs = nn.functional.dropout(probs, p=0.1, training=self.training)
        out = torch.matmul(probs, v)
        return (out, probs) if self.return_probs else out


class _TensorScale(nn.Module):
    def forward(self, q, k, v, scale):
        return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def _qkv():
    torch.manual_seed(0)
    return torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)


def _causal_mask() -> torch.Tensor:
    keep = torch.ones(5, 6, dtype=torch.bool).tril(diagonal=1)
    return torch.zeros(1, 1, 5, 6).masked_fill(~keep, torch.finfo(torch.float32).min)


PATTERNS = [RemoveDropout(), *EXPLICIT_ATTENTION_PATTERNS]  # eval dropout sits before p @ v


def _entries(model, args):
    entries = embedl_dynamo.get_transformation_plan(model.eval(), PATTERNS, args).entries
    return [e for e in entries if e.pattern.name != "remove_dropout"]


@pytest.mark.parametrize(
    ("masked", "pattern"), [(True, "explicit_attention_masked"), (False, "explicit_attention")]
)
def test_attention_written_out_matches(masked, pattern):
    args = (*_qkv(), _causal_mask()) if masked else _qkv()
    applied = [e.pattern.name for e in _entries(_Attention(masked), args) if e.apply]
    assert applied == [pattern]


@pytest.mark.parametrize(
    ("model", "args", "reason"),
    [
        (_Attention(False, softmax_dim=2), _qkv(), "softmax over axis 2, not the keys' axis"),
        (_TensorScale(), (*_qkv(), torch.tensor(0.3)), "the scale is a tensor, not a number"),
        (_Attention(True), (*_qkv(), _causal_mask() < 0), "the mask is not a float tensor"),
        (
            _Attention(True),
            (*_qkv(), torch.zeros(3, 2, 4, 5, 6)),
            "the mask broadcasts the scores to another shape",
        ),
    ],
    ids=["softmax-axis", "tensor-scale", "bool-mask", "wider-mask"],
)
def test_other_computations_are_not_rewritten_and_say_why(model, args, reason):
    entries = _entries(model, args)
    assert entries and not any(e.apply for e in entries)
    assert any(e.reason.startswith(reason) for e in entries), [e.reason for e in entries]


def test_probabilities_read_elsewhere_keep_the_attention_as_it_is():
    """``output_attentions``: the probabilities are an output, so SDPA cannot replace them."""
    entries = _entries(_Attention(False, return_probs=True), _qkv())
    assert entries and not any(e.apply for e in entries)
    assert all(e.reason.endswith("is used outside the match") for e in entries)


@pytest.mark.parametrize("masked", [True, False])
def test_the_rewrite_computes_the_same_attention(masked):
    args = (*_qkv(), _causal_mask()) if masked else _qkv()
    model = _Attention(masked).eval()
    result = embedl_dynamo.transform(model, args, PATTERNS)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert [n.target for n in result.model.graph.nodes if n.op == "call_function"] == [sdpa]
    torch.testing.assert_close(result.model(*args), model(*args), rtol=0, atol=1e-6)


def test_written_out_attention_is_fused_on_every_target():
    """With the targets' own lists, the SDPA it becomes is fused into one attention."""
    args = (*_qkv(), _causal_mask())
    for name in ("tensorrt", "onnxruntime", "openvino"):
        backend = backend_by_name(name)
        patterns = [*backend.conversion_patterns, *backend.fusion_patterns]
        entries = embedl_dynamo.get_transformation_plan(
            _Attention(True).eval(), patterns, args
        ).entries
        applied = {e.pattern.name for e in entries if e.apply}
        assert {"explicit_attention_masked", "scaled_dot_product_attention"} <= applied, name
