"""Shapes of the nodes a rewrite creates (:func:`embedl_dynamo.graph.meta.infer_meta`): on meta
tensors for concrete shapes, on the inputs' own fake mode for symbolic ones; or stated by the
rewrite (:func:`~embedl_dynamo.graph.meta.set_meta_shape`)."""

from __future__ import annotations

import torch
from torch import fx
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from embedl_dynamo.graph.meta import infer_meta, set_meta_shape
from embedl_dynamo.graph.nodes import node_shape


def _graph_with_inputs(a, b) -> tuple[fx.GraphModule, fx.Node]:
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    x.meta["val"], y.meta["val"] = a, b
    out = graph.call_function(torch.mul, (x, y))
    graph.output(out)
    return fx.GraphModule(torch.nn.Module(), graph), out


def _dynamic(mode: FakeTensorMode, real: torch.Tensor) -> torch.Tensor:
    """``real`` as a fake tensor of ``mode`` whose second size is symbolic."""
    context = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
    )
    return mode.from_tensor(real, symbolic_context=context)


def test_symbolic_inputs_keep_their_own_mode_inside_another_tracing_context():
    """Under ``torch.compile(dynamic=True)`` the rewrites run inside a Dynamo tracing context
    whose fake mode is not that of the graph's example values: the shape comes from the
    inputs' mode (it was lost: "Mixing fake modes")."""
    values = FakeTensorMode(shape_env=ShapeEnv())
    x = _dynamic(values, torch.empty(2, 5, 4))
    scale = values.from_tensor(torch.tensor(0.5))
    gm, out = _graph_with_inputs(x, scale)
    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        infer_meta(gm, [out])
    shape = node_shape(out)
    assert shape is not None and shape[0] == 2 and shape[2] == 4
    assert isinstance(shape[1], torch.SymInt)  # still symbolic


def test_inputs_of_two_fake_modes_leave_the_shape_unknown():
    a = FakeTensorMode().from_tensor(torch.empty(2, 3))
    b = FakeTensorMode().from_tensor(torch.empty(2, 3))
    gm, out = _graph_with_inputs(a, b)
    infer_meta(gm, [out])
    assert node_shape(out) is None


def test_concrete_shapes_need_no_fake_mode():
    gm, out = _graph_with_inputs(torch.empty(2, 3, device="meta"), torch.empty(3, device="meta"))
    infer_meta(gm, [out])
    assert node_shape(out) == (2, 3)


def _repeated(value) -> tuple[fx.GraphModule, fx.Node, fx.Node]:
    graph = fx.Graph()
    k = graph.placeholder("k")
    if value is not None:
        k.meta["val"] = value
    out = graph.call_function(torch.repeat_interleave, (k, 3), {"dim": -3})
    graph.output(out)
    return fx.GraphModule(torch.nn.Module(), graph), k, out


def test_a_stated_shape_equals_the_inferred_one_and_stays_symbolic():
    """A rewrite that knows its node's shape states it: the value is that :func:`infer_meta`
    computes by running the op, symbolic sizes and all, without running it."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    k = _dynamic(mode, torch.empty(2, 5, 4)).unsqueeze(0)  # (1, 2, s, 4), s symbolic
    gm, k_node, stated = _repeated(k)
    set_meta_shape(stated, k_node, (1, 6, k.shape[2], 4))
    _, _, inferred = _repeated(k)
    infer_meta(gm, [inferred])
    assert node_shape(stated) == node_shape(inferred)
    assert isinstance(node_shape(stated)[2], torch.SymInt)
    assert stated.meta["val"].fake_mode is mode and stated.meta["val"].dtype == k.dtype


def test_a_stated_shape_on_meta_tensors_and_on_an_unknown_input():
    gm, k_node, out = _repeated(torch.empty(1, 2, 7, 4, dtype=torch.float16, device="meta"))
    set_meta_shape(out, k_node, (1, 6, 7, 4))
    assert node_shape(out) == (1, 6, 7, 4) and out.meta["val"].dtype == torch.float16
    gm, k_node, out = _repeated(None)  # the input's shape is unknown: so is the output's
    set_meta_shape(out, k_node, (1, 6, 7, 4))
    assert node_shape(out) is None
