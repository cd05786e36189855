"""A Dynamo graph as JSON data and back (:mod:`embedl_dynamo.dynamo.graph_data`): the same nodes,
names and arguments, Dynamo's example values made again and checked, and what cannot be saved
refused by name."""

from __future__ import annotations

import json
import operator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

from embedl_dynamo import SavedFunctionError
from embedl_dynamo.dynamo.example_values import add_example_values
from embedl_dynamo.dynamo.graph_data import graph_from_data, graph_to_data
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


def _layouts(gm: fx.GraphModule) -> list[tuple[str, Any]]:
    """Each node's example value as (shape, dtype, strides, offset), the first earlier node
    whose value shares its storage, and the first whose value it is."""
    seen_storage: dict[Any, str] = {}
    seen_value: dict[int, str] = {}
    rows = []
    for node in gm.graph.nodes:
        values = node.meta.get("example_value")
        values = values if isinstance(values, (tuple, list)) else (values,)
        for index, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                continue
            storage = StorageWeakRef(value.untyped_storage())
            layout = (tuple(value.shape), value.dtype, value.stride(), value.storage_offset())
            shares = seen_storage.setdefault(storage, f"{node.name}[{index}]")
            same = seen_value.setdefault(id(value), f"{node.name}[{index}]")
            rows.append((f"{node.name}[{index}]", (layout, shares, same)))
    return rows


def _counting_targets(gm: fx.GraphModule) -> list[str]:
    """Wrap each call_function target of ``gm`` so that a run of it is noted in the list."""
    ran: list[str] = []
    for node in gm.graph.nodes:
        if node.op == "call_function":

            def counted(*args, _target=node.target, _name=node.name, **kwargs):
                ran.append(_name)
                return _target(*args, **kwargs)

            node.target = counted
    return ran


class ViewsAndWrites(nn.Module):
    """Batch norms (whose meta function is a decomposition), views of one storage, a split's
    tuple, in-place writes returning their input, and a transposed (non-contiguous) result."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x))
        a, b = y.split(4, dim=1)
        a.relu_()
        flat = b.flatten(2).transpose(1, 2)
        flat.mul_(2.0)
        return a.sum() + flat.contiguous().view(-1)[:5]


def test_example_values_are_made_from_the_saved_layouts_without_running_an_op():
    model = ViewsAndWrites().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 6, 6))
    loaded = graph_from_data(json.loads(json.dumps(graph_to_data(gm))))
    ran = _counting_targets(loaded)
    add_example_values(loaded, inputs)
    assert ran == []
    assert _layouts(loaded) == _layouts(gm)  # strides, shared storages and identities


def test_a_record_without_layouts_runs_the_graph_on_fake_tensors():
    model = ViewsAndWrites().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 6, 6))
    records = graph_to_data(gm)
    for record in records:  # as a file saved before layouts were recorded
        specs = record.get("value")
        for spec in specs if isinstance(specs, list) else [specs]:
            for key in ("stride", "offset", "device", "storage", "same"):
                if isinstance(spec, dict):
                    spec.pop(key, None)
    loaded = graph_from_data(records)
    ran = _counting_targets(loaded)
    add_example_values(loaded, inputs)
    assert "conv2d" in ran and len(ran) == sum(n.op == "call_function" for n in loaded.graph.nodes)
    assert _layouts(loaded) == _layouts(gm)


def test_arguments_laid_out_otherwise_run_the_graph_and_keep_their_own_layouts():
    model = ViewsAndWrites().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 6, 6))
    loaded = graph_from_data(graph_to_data(gm))
    ran = _counting_targets(loaded)
    position = next(i for i, t in enumerate(inputs) if t.shape == (2, 3, 6, 6))
    inputs[position] = torch.randn(2, 6, 6, 3).permute(0, 3, 1, 2)  # same shape, other strides
    add_example_values(loaded, inputs)
    assert "conv2d" in ran
    placeholder = [n for n in loaded.graph.nodes if n.op == "placeholder"][position]
    assert placeholder.meta["example_value"].stride() == inputs[position].stride()
