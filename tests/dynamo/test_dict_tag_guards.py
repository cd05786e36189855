"""Our compiled calls under PyTorch's dict-tag guard fast path
(``torch._dynamo.config.use_recursive_dict_tags_for_guards``), which the docs recommend
against the per-call cost of guards: a module tree whose dicts did not change skips its guards,
so every change a user makes after compiling must still reach the compiled call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers import assert_close_to_scale


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5)).eval()


def test_changes_after_compiling_reach_the_call_under_dict_tag_guards(tmp_path):
    torch._dynamo.reset()
    model = _net()
    x = torch.randn(2, 3, 8, 8)
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True), torch.no_grad():
        compiled = torch.compile(
            model, backend="embedl_onnxruntime", options={"cache_dir": str(tmp_path)}
        )
        first = compiled(x)
        assert_close_to_scale(first, model(x))

        model[0].weight = nn.Parameter(torch.randn_like(model[0].weight))  # replaced
        replaced = compiled(x)
        assert not torch.allclose(replaced, first)
        assert_close_to_scale(replaced, model(x))

        model[0].weight.mul_(2.0)  # written in place: our weight check, not a guard
        assert_close_to_scale(compiled(x), model(x))

        model[2] = nn.Sigmoid()  # a swapped submodule
        assert_close_to_scale(compiled(x), model(x))

        model.train()  # recompiled, and run eagerly with one warning: dropout zeroes about half
        with pytest.warns(RuntimeWarning, match="training mode"):
            zeroed = (compiled(x) == 0).float().mean().item()
        assert 0.3 < zeroed < 0.7
    torch._dynamo.reset()
