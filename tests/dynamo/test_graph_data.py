"""A Dynamo graph as JSON data and back (:mod:`embedl_dynamo.dynamo.graph_data`): the same nodes,
names and arguments, Dynamo's example values made again and checked, and what cannot be saved
refused by name."""

from __future__ import annotations

import json
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo import SavedFunctionError
from embedl_dynamo.dynamo.graph_data import add_example_values, graph_from_data, graph_to_data
from embedl_dynamo.graph.printer import format_graph


class Attention(nn.Module):
    """Slices, views, a dtype keyword, a -inf fill, an arange on a device, a getitem of a
    tuple, an in-place add: the arguments a transformer's graph holds."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(8, dim=-1)
        q = q.view(2, 5, 2, 4).transpose(1, 2)
        k = k.reshape(2, 5, 2, 4).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        mask = torch.arange(5, device=x.device)[None, :] > torch.arange(5)[:, None]
        scores = scores.masked_fill(mask, float("-inf"))
        out = F.softmax(scores, dim=-1, dtype=torch.float32) @ v.view(2, 5, 2, 4).transpose(1, 2)
        out = out.transpose(1, 2).flatten(2)[:, 1:, ...]
        out += 1.0
        return out.max(dim=-1)[0]


def _dynamo_graph(model: nn.Module, *inputs: torch.Tensor) -> tuple[fx.GraphModule, list]:
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    return seen[0]


def test_a_graph_round_trips_through_json():
    model = Attention().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 5, 8))
    data = json.loads(json.dumps(graph_to_data(gm)))  # plain JSON, nothing else
    loaded = graph_from_data(data)
    add_example_values(loaded, inputs)
    assert format_graph(loaded, literals=True) == format_graph(gm, literals=True)
    for ours, dynamos in zip(loaded.graph.nodes, gm.graph.nodes):
        theirs = dynamos.meta.get("example_value")
        if isinstance(theirs, torch.Tensor):
            value = ours.meta["example_value"]
            assert (value.shape, value.dtype) == (theirs.shape, theirs.dtype), ours.name
    with torch.no_grad():
        torch.testing.assert_close(loaded(*inputs), gm(*inputs), rtol=0, atol=0)
    targets = {str(n["target"]) for n in data if n["op"] == "call_function"}
    assert "{'fn': ['torch.nn.functional', 'linear']}" in targets
    assert "{'fn': ['operator', 'getitem']}" in targets


def test_other_arguments_than_saved_are_refused():
    gm, inputs = _dynamo_graph(nn.Linear(4, 2).eval(), torch.randn(3, 4))
    loaded = graph_from_data(graph_to_data(gm))
    inputs[-1] = torch.randn(5, 4)  # another batch size than the graph was saved for
    with pytest.raises(
        SavedFunctionError, match=r"gives \(5, 4\) torch.float32, saved as \(3, 4\)"
    ):
        add_example_values(loaded, inputs)


def test_what_cannot_be_named_is_refused_by_node():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_not_in_torch, (x,)))
    with pytest.raises(SavedFunctionError, match="node _not_in_torch calls .*cannot name"):
        graph_to_data(fx.GraphModule(nn.Module(), graph))
    graph = fx.Graph()
    x = graph.placeholder("x")
    add = graph.call_function(operator.add, (x, 1))
    graph.output(add)
    gm = fx.GraphModule(nn.Module(), graph)
    add.args = (x, object())  # no code is generated from it again
    with pytest.raises(SavedFunctionError, match="node add: argument <object .* cannot be saved"):
        graph_to_data(gm)


def test_a_dynamic_size_is_refused():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.randn(3, 4))
    with pytest.raises(SavedFunctionError, match="static shapes"):
        graph_to_data(seen[0])


def test_a_record_names_only_what_this_package_looks_up():
    records = [{"op": "call_function", "name": "f", "target": {"fn": ["os", "system"]}}]
    with pytest.raises(SavedFunctionError, match="not one this package looks up"):
        graph_from_data(records)


def _not_in_torch(x: torch.Tensor) -> torch.Tensor:
    return x
