"""Refit through the exporter's folds (issue 51, refit for transformers): a linear weight the
exporter transposed into an initializer of its own (``MatMul(x, W.t())``), and a buffer it
folded away (positions sliced at export), are recorded in the file's metadata at export
(:mod:`embedl_dynamo.onnx.constant_views`), so new weights refit instead of building anew."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.onnx.constant_views import FOLDED_KEY, TRANSPOSED_KEY
from tests.helpers import BUILD_COUNTS, wait_until_stored


class PositionsAndLinear(nn.Module):
    """A BERT embedding's shape: positions sliced from a buffer, then linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position_ids", torch.arange(16).unsqueeze(0), persistent=True)
        self.positions = nn.Embedding(16, 32)
        self.dense = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = self.positions(self.position_ids[:, : x.shape[1]])
        return self.out(torch.relu(self.dense(x + positions)))


X = torch.randn(2, 8, 32)


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = PositionsAndLinear().eval()
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5).add_(0.01)
    return model, other


def _refit_report(model: nn.Module, new_state: dict) -> tuple[dict, torch.Tensor]:
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        model.load_state_dict(new_state)
        out = compiled(X)
    return embedl_dynamo.last_report().subgraphs[-1].pipeline["refit"], out


def test_transposed_linear_weights_and_unchanged_folded_buffers_refit():
    model, other = _pair()
    refit, out = _refit_report(model, other.state_dict())
    assert refit["refitted"], refit
    assert BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == 1
    with torch.no_grad():
        torch.testing.assert_close(out, other(X), rtol=1e-5, atol=1e-5)


def test_a_folded_buffer_that_changes_is_built_anew_with_the_reason():
    """No match: the positions the exporter folded away change, and nothing in the file holds
    them by name: built anew, and the answer is the new buffer's."""
    model, other = _pair()
    state = other.state_dict()
    state["position_ids"] = torch.arange(16).flip(0).unsqueeze(0)
    refit, out = _refit_report(model, state)
    assert not refit["refitted"] and "position_ids" in refit["reason"], refit
    with torch.no_grad():
        other.load_state_dict(state)
        torch.testing.assert_close(out, other(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", [TRANSPOSED_KEY, FOLDED_KEY])
def test_the_export_records_what_it_folded(tmp_path, key):
    onnx = pytest.importorskip("onnx")
    model, _ = _pair()
    path = embedl_dynamo.export(model, (X,), tmp_path / "m.onnx", backend="onnxruntime")
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert key in props
    recorded = sorted(json.loads(props[key]))  # constants by the transformed graph's names
    if key == TRANSPOSED_KEY:  # initializer -> constant
        constants = sorted(json.loads(props[key]).values())
        assert sorted(c.rsplit("_", 1)[-1] for c in constants) == ["dense.weight", "out.weight"]
    else:  # constant -> digest
        assert [c for c in recorded if c.endswith("position_ids")], recorded
