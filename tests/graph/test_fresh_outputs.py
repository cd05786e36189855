"""Picks of an op whose outputs are new tensors share storage with nothing
(:mod:`embedl_dynamo.graph.aliasing`, structural rule): Mixtral's router divides ``topk``'s
values in place and reads its indices after, which was refused as a write through a view (the
whole model in PyTorch); it is made functional and matches eager. Picks of ``split`` still
alias their input, and indexing ``max``'s tensor (no dim) still views it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.graph.aliasing import alias_classes
from embedl_dynamo.graph.functionalize import mutation_blocker
from tests.helpers import runtime_compiled


class _Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor):
        values, indices = torch.topk(torch.softmax(self.gate(x), -1), 2, dim=-1)
        values /= values.sum(-1, keepdim=True)
        return values * 2.0, indices


def _named(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in gm.graph.nodes}


def test_picks_of_topk_alias_nothing_so_an_in_place_write_is_made_functional():
    gm = torch.fx.symbolic_trace(_Router())  # no recorded values: the structural rule
    classes, nodes = alias_classes(gm), _named(gm)
    assert classes[nodes["getitem"]] != classes[nodes["getitem_1"]]
    assert mutation_blocker(gm) is None


def test_picks_of_views_still_alias_their_input():
    def split_then_write(x: torch.Tensor):
        first, second = x.split(2)
        first.mul_(2.0)
        return second + 1.0, x.max()[None]

    gm = torch.fx.symbolic_trace(split_then_write)
    classes, nodes = alias_classes(gm), _named(gm)
    assert classes[nodes["getitem"]] == classes[nodes["getitem_1"]] == classes[nodes["x"]]
    assert classes[nodes["getitem_2"]] == classes[nodes["max_1"]]  # indexing max's tensor
    assert mutation_blocker(gm) is not None


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_the_router_runs_on_the_runtime_with_eagers_outputs(runtime):
    model = _Router().eval()
    compiled = runtime_compiled(model, runtime)
    with torch.no_grad():
        for seed in range(2):
            x = torch.randn(5, 8, generator=torch.Generator().manual_seed(seed))
            (values, indices), (want_values, want_indices) = compiled(x), model(x)
            torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-6)
            assert torch.equal(indices, want_indices)
    (sub,) = embedl_dynamo.last_report()
    assert sub.status in ("compiled", "partitioned") and sub.runtime == runtime
