"""Which axes of a Dynamo graph stay dynamic in its artifact
(:func:`embedl_dynamo.graph.dynamic_axes.dynamic_axes`)."""

from __future__ import annotations

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from embedl_dynamo.graph.dynamic_axes import dynamic_axes


def _cache_graph(specialise_heads: bool) -> tuple[fx.GraphModule, torch.Tensor]:
    """A graph taking a (batch, heads, length, head_dim) cache whose four sizes Dynamo made
    symbolic, as ``torch.compile(dynamic=True)`` does; the model's ``view`` to its fixed head
    count and head size guards those two back to numbers when ``specialise_heads``."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
    real = torch.empty(1, 2, 65, 64)
    fake = mode.from_tensor(real, symbolic_context=context)
    if specialise_heads:
        with mode:
            fake.view(fake.shape[0], 2, fake.shape[2], 64)
    graph = fx.Graph()
    cache = graph.placeholder("cache")
    cache.meta["example_value"] = fake
    out = graph.call_function(torch.neg, (cache,))
    out.meta["example_value"] = fake
    graph.output(out)
    return fx.GraphModule(torch.nn.Module(), graph), real


def test_sizes_dynamo_specialised_to_numbers_are_static_axes():
    """Exported as named axes ("2", "64"), the head count and head size left ONNX Runtime
    without the static shapes it plans and fuses with: decoding under ``dynamic=True`` ran
    slower than without it."""
    gm, cache = _cache_graph(specialise_heads=True)
    axes = dynamic_axes(gm, [0], [cache], dynamic_batch=True)
    (inputs,) = axes.inputs
    assert sorted(inputs) == [0, 2] and inputs[0] == "batch"  # batch and length only
    assert axes.outputs == (inputs,)
    assert not axes.static_graph


def test_sizes_still_symbolic_are_dynamic_axes():
    gm, cache = _cache_graph(specialise_heads=False)
    (inputs,) = dynamic_axes(gm, [0], [cache], dynamic_batch=True).inputs
    assert sorted(inputs) == [0, 1, 2, 3] and len(set(inputs.values())) == 4
