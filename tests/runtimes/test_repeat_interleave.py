"""``repeat_interleave`` by an int (gcvit's window attention, grouped-query attention written
that way): its row (:mod:`embedl_dynamo.runtimes.conformance`, ``repeat_interleave(int
repeats)``) is checked here, as OpInfo's samples repeat by tensors. Each slice is copied
``repeats`` times, so every dtype is exact on both CPU runtimes, NaN, infinities and -0.0
included, over every ``dim``; repeats given as a tensor stay in PyTorch."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.runtimes.conformance import node_blocker, op_name
from tests.runtimes.conformance_check import compile_on

RUNTIMES = ("onnxruntime", "openvino")
EDGES = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1.5, 2.0**24 + 1])


def _sample(dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.cat([EDGES, torch.arange(18.0)]).reshape(2, 3, 4).to(dtype)
    if dtype == torch.bool:
        return torch.arange(24).reshape(2, 3, 4) % 3 == 0
    return (torch.arange(24) * 40_000_003 - 2**29).reshape(2, 3, 4).to(dtype)  # past 2**24


def _repeated(x: torch.Tensor):
    # each output a new tensor (a view would keep it in PyTorch), and no arithmetic
    return tuple(
        o.clone()
        for o in (
            x.repeat_interleave(2, dim=1),
            torch.repeat_interleave(x, 3, dim=-1),
            x.repeat_interleave(2),  # flattened first
            torch.repeat_interleave(x, repeats=2, dim=0),
        )
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_int_repeats_are_exact_on_the_runtime(runtime, dtype):
    x = _sample(dtype)
    torch._dynamo.reset()
    got, want = compile_on(_repeated, runtime, fallback="eager")(x), _repeated(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(_bits(g), _bits(w))
    placed = [r for r in embedl_dynamo.last_report().subgraphs if r.runtime == runtime]
    assert placed and all(not r.kept for r in placed)


def test_tensor_repeats_are_another_op_and_stay_in_pytorch():
    def both(t: torch.Tensor, r: torch.Tensor):
        return t.repeat_interleave(2, dim=1), t.repeat_interleave(r, dim=0)

    gm = torch.fx.symbolic_trace(both)
    names = [op_name(n) for n in gm.graph.nodes if n.op == "call_method"]
    assert names == ["repeat_interleave(int repeats)", "repeat_interleave"]
    kept = node_blocker([n for n in gm.graph.nodes if n.op == "call_method"][1], "onnxruntime")
    assert kept is not None and "repeat_interleave" in kept
