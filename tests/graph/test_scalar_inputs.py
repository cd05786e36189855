"""Int inputs the artifact takes as 0-d tensors (``int_as_tensor``): a KV cache's position
counter, as Mistral's sliding-window cache keeps it (a Python int bounded below by a literal,
``max(n - window + 1, 0)``, and returned grown by the new tokens), runs on the runtime."""

from __future__ import annotations

import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.graph.freeze import freeze
from tests.helpers import dynamo_graph


class Counter:
    """A cache's Python-int lengths: ``n`` read by the graph, ``m`` only grown."""

    def __init__(self) -> None:
        self.n = 0
        self.m = 0


class Window(nn.Module):
    """Positions offset by the start of a window of 4 behind the counter."""

    def __init__(self, bound_by_size: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bound_by_size = bound_by_size

    def forward(self, x: torch.Tensor, c: Counter) -> torch.Tensor:
        floor = x.shape[1] if self.bound_by_size else 0
        start = max(c.n - 4 + 1, floor)
        positions = torch.arange(x.shape[1]) + start
        c.n = c.n + x.shape[1]
        c.m = c.m + x.shape[1]
        return self.lin(x) + positions[None, :, None]


def test_a_counter_bounded_by_a_literal_and_returned_runs_on_the_runtime():
    torch.manual_seed(0)
    model = Window().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", options={"fallback": "raise"})
    counter, reference = Counter(), Counter()
    with torch.no_grad():
        for length in (3, 3, 2, 3):  # the counter's int becomes dynamic after the first call
            x = torch.randn(1, length, 8)
            torch.testing.assert_close(compiled(x, counter), model(x, reference))
            assert (type(counter.n), counter.n, counter.m) == (int, reference.n, reference.m)
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert {s.runtime for s in subgraphs} == {"onnxruntime"}, [s.reason for s in subgraphs]
    # the first call, the counter made dynamic, the length made dynamic: reading the int's
    # example value must not specialize a graph to it (a recompile per call, per decoded token)
    assert len(subgraphs) == 3, [str(s) for s in subgraphs]


def _frozen_int_inputs(model: nn.Module) -> tuple[list[str], torch.fx.GraphModule]:
    """The names of the ints the frozen graph takes as tensors, and the frozen graph."""
    counter = Counter()
    counter.n = 5
    x = torch.randn(1, 3, 8)
    gm = dynamo_graph(model, x, counter, dynamic=True)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = [n.meta["example_value"] for n in placeholders]
    inputs = [5 if isinstance(v, torch.SymInt) else v for v in inputs]
    result = freeze(gm, inputs)
    return [placeholders[i].name for i in result.int_inputs], result.gm


def test_max_with_a_literal_becomes_a_clamp_of_the_int_tensor():
    int_inputs, gm = _frozen_int_inputs(Window().eval())
    assert [name[-1] for name in int_inputs] == ["n", "m"]
    targets = {n.target for n in gm.graph.nodes}
    assert torch.clamp in targets and torch.sym_max not in targets


def test_max_with_another_number_keeps_the_int():
    """``max(n - 3, x.shape[1])`` bounds the int by a size, no literal: no clamp computes it
    (``m``, only grown by a size, is still taken as a tensor)."""
    int_inputs, gm = _frozen_int_inputs(Window(bound_by_size=True).eval())
    assert [name[-1] for name in int_inputs] == ["m"]
    assert torch.sym_max in {n.target for n in gm.graph.nodes}
