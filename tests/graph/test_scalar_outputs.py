"""Number outputs of a graph: sizes are split off to be computed in PyTorch, others are not."""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from embedl_dynamo.graph.scalar_outputs import split_scalar_outputs
from tests.helpers import dynamo_graph


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


def _grown_by_size() -> fx.GraphModule:
    """``return relu(x) * 2, n + relu(x).size(0)``, as Dynamo gives it after a recompile with
    dynamic sizes: a cache length grown by a size read off an intermediate tensor (Mistral's
    ``cumulative_length_int += key_states.shape[-2]``), symbolic example values."""
    shape_env = ShapeEnv()

    def symbol(name: str, hint: int) -> torch.SymInt:
        return shape_env.create_symintnode(
            shape_env.create_symbol(hint, source=ConstantSource(name)), hint=hint
        )

    with FakeTensorMode(shape_env=shape_env):
        fake_x = torch.empty(symbol("x_rows", 5), 4)
        fake_n = symbol("n", 7)
        fake_key = torch.relu(fake_x)
    graph = fx.Graph()
    x, n = graph.placeholder("x"), graph.placeholder("n")
    key = graph.call_function(torch.relu, (x,))
    size = graph.call_method("size", (key, 0))
    out = graph.call_function(operator.mul, (key, 2))
    grown = graph.call_function(operator.add, (n, size))
    values = [
        (x, fake_x),
        (n, fake_n),
        (key, fake_key),
        (size, fake_key.shape[0]),
        (out, fake_key),
        (grown, fake_n + fake_key.shape[0]),
    ]
    for node, value in values:
        node.meta["example_value"] = value
    graph.output((out, grown))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_number_read_off_an_intermediate_tensor_comes_from_its_symbol():
    split = split_scalar_outputs(_grown_by_size())
    assert split.blocker is None and split.scalars is not None
    x = torch.randn(9, 4)
    (tensor,) = split.tensors(x, torch.tensor(3))  # the int as the artifact takes it
    y, n = split.scalars.merge([tensor], [x, torch.tensor(3)])
    torch.testing.assert_close(y, torch.relu(x) * 2)
    assert type(n) is int and n == 3 + 9


def test_a_symbol_no_input_carries_is_not_split():
    """``.item()`` gives a symbol of its own: no input size or int gives it back."""

    def f(x):
        return x * 2, int(x.sum().item())

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        gm = dynamo_graph(f, torch.ones(3, 4), dynamic=True)
    split = split_scalar_outputs(gm)
    assert split.scalars is None and "not sizes only" in split.blocker
