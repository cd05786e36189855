"""A graph's fingerprint holds the autocast state and the default dtype (issue 50 item 8): the
same graph compiled under ``torch.autocast`` or another default dtype computes other numbers,
so its artifact must have a key of its own."""

from __future__ import annotations

import contextlib

import torch
from torch import fx, nn

from embedl_dynamo.cache.keys import fingerprint_graph
from embedl_dynamo.cache.numerics import numerics_state


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _graph() -> fx.GraphModule:
    torch.manual_seed(0)
    return fx.symbolic_trace(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))


def test_the_state_names_autocast_only_where_it_is_enabled():
    assert numerics_state() == {"default_dtype": "torch.float32"}
    with torch.autocast("cpu", torch.bfloat16):
        assert numerics_state() == {
            "default_dtype": "torch.float32",
            "autocast": {"cpu": "torch.bfloat16"},
        }
    with torch.autocast("cpu", torch.bfloat16, enabled=False):
        assert numerics_state() == {"default_dtype": "torch.float32"}
    with _default_dtype(torch.float64):
        assert numerics_state() == {"default_dtype": "torch.float64"}


def test_autocast_and_the_default_dtype_change_the_fingerprint_and_nothing_else_does():
    gm = _graph()
    plain = fingerprint_graph(gm)
    assert fingerprint_graph(_graph()) == plain  # equal graphs, equal keys
    with torch.autocast("cpu", torch.bfloat16):
        bf16 = fingerprint_graph(gm)
    with torch.autocast("cpu", torch.float16):
        fp16 = fingerprint_graph(gm)
    with _default_dtype(torch.float64):
        float64 = fingerprint_graph(gm)
    assert len({plain, bf16, fp16, float64}) == 4
    with torch.no_grad(), torch.inference_mode():  # grad mode changes no number
        assert fingerprint_graph(gm) == plain
    assert fingerprint_graph(gm) == plain  # the state is read on each call, not kept
