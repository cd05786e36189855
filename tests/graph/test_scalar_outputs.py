"""Number outputs of a graph: sizes are split off to be computed in PyTorch, others are not."""

from __future__ import annotations

import operator

import torch
from torch import fx

from embedl_dynamo.graph.scalar_outputs import split_scalar_outputs


def _graph(number_from_values: bool) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.zeros(3, 4)
    y = graph.call_function(torch.relu, (x,))
    y.meta["example_value"] = torch.zeros(3, 4)
    if number_from_values:
        number = graph.call_method("item", (graph.call_method("sum", (y,)),))
    else:
        number = graph.call_function(operator.mul, (graph.call_method("size", (x, 0)), 2))
    number.meta["example_value"] = 6
    graph.output((y, number))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_size_output_is_computed_from_the_inputs_beside_the_tensors():
    split = split_scalar_outputs(_graph(number_from_values=False))
    assert split.blocker is None and split.scalars is not None
    x = torch.randn(5, 4)
    tensors = split.tensors(x)
    assert len(tensors) == 1
    y, n = split.scalars.merge(tensors, [x])
    torch.testing.assert_close(y, torch.relu(x))
    assert type(n) is int and n == 10


def test_a_number_computed_from_tensor_values_is_not_split():
    gm = _graph(number_from_values=True)
    split = split_scalar_outputs(gm)
    assert split.tensors is gm and split.scalars is None
    assert split.blocker is not None and "not sizes only" in split.blocker
