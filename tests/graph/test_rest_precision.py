"""A graph's rest precision: marked on a graph of its own that shares the weights, and part of
its fingerprint (:mod:`embedl_dynamo.graph.rest_precision`)."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from embedl_dynamo.cache.keys import fingerprint_graph
from embedl_dynamo.graph.rest_precision import rest_precision, with_rest_precision


def _graph() -> fx.GraphModule:
    return fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval())


def test_marked_graph_shares_weights_and_computes_the_same() -> None:
    gm = _graph()
    marked = with_rest_precision(gm, "bf16")
    assert rest_precision(marked) == "bf16" and rest_precision(gm) is None
    assert marked.graph is not gm.graph
    assert marked.get_submodule("0").weight is gm.get_submodule("0").weight
    x = torch.randn(3, 4)
    assert torch.equal(marked(x), gm(x))


def test_the_mark_changes_the_fingerprint_only_when_set() -> None:
    gm = _graph()
    assert fingerprint_graph(with_rest_precision(gm, "bf16")) != fingerprint_graph(gm)
    assert fingerprint_graph(with_rest_precision(gm, "bf16")) == fingerprint_graph(
        with_rest_precision(gm, "bf16")
    )


def test_only_a_half_type_is_a_rest_precision() -> None:
    with pytest.raises(ValueError, match="not a half type"):
        with_rest_precision(_graph(), "int8")


def test_a_plain_module_has_no_rest_precision() -> None:
    assert rest_precision(nn.Linear(2, 2)) is None
