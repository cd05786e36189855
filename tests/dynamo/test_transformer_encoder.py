"""PyTorch's own ``nn.TransformerEncoder`` in eval mode reaches a runtime (issue 39 item 8):
its fast-path op ``_transformer_encoder_layer_fwd`` is decomposed, and where it cannot be (a
padding mask) the fallback names the fix."""

from __future__ import annotations

import logging

import torch
from torch import nn

import embedl_dynamo
from tests.helpers import assert_close_to_scale


def _encoder(layers: int) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def test_a_two_layer_encoder_in_eval_runs_on_the_runtime():
    """Regression: its two fast-path nodes counted as "2 ops < min_subgraph_size=3"."""
    model, x = _encoder(2), torch.randn(2, 5, 16)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_onnxruntime")(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason
    assert sub.pipeline["applied_by_pattern"]["decompose_transformer_encoder_layer"] == 2


def test_a_masked_fast_path_layer_falls_back_naming_the_fix(caplog):
    model, x = _encoder(1), torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        actual = torch.compile(model, backend="embedl_onnxruntime")(x, None, pad)
        expected = model(x, src_key_padding_mask=pad)
    assert_close_to_scale(actual[~pad], expected[~pad])  # padded positions are unspecified
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "eager"
    assert "torch.backends.mha.set_fastpath_enabled(False)" in sub.reason
    fixes = [r for r in caplog.records if "set_fastpath_enabled(False)" in r.getMessage()]
    assert len(fixes) == 1
