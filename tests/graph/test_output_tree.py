"""Tests for :mod:`embedl_dynamo.graph.output_tree`: the model's output structure over its
graph's flat outputs, recorded at capture and written as JSON."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.output_tree import OUTPUT_TREE_META, OutputTree


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = self.fc(x) + y.sum()
        return {"h": h, "more": [(h * 2, None), y, 1.5], "again": h}


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_capture_records_the_structure_and_it_rebuilds(dynamic_batch) -> None:
    model = _Nested().eval()
    gm = capture(model, (torch.randn(2, 4), torch.randn(2, 5)), dynamic_batch=dynamic_batch)
    tree = gm.meta[OUTPUT_TREE_META]
    assert isinstance(tree, OutputTree) and tree.count == 2 and tree.covers_outputs
    x, y = torch.randn(3, 4), torch.randn(3, 5)
    flat = gm(x, y)
    got = tree.rebuild(flat, (x, y))
    with torch.no_grad():
        want = model(x, y)
    assert list(got) == ["h", "more", "again"]
    assert got["more"][0][1] is None and got["more"][1] is y and got["more"][2] == 1.5
    assert got["again"] is got["h"]  # one graph output returned twice stays one tensor
    torch.testing.assert_close(got["more"][0][0], want["more"][0][0])
    assert [t is f for t, f in zip(tree.graph_outputs(got), flat)] == [True, True]


def test_the_json_form_round_trips() -> None:
    tree = OutputTree.of({"a": (1, None)}, (), ())
    text = json.dumps(tree.to_dict())
    again = OutputTree.from_dict(json.loads(text))
    assert again == tree
    assert again.rebuild((), ()) == {"a": (1, None)}


def _one_leaf_tree(leaf: dict) -> dict:
    """The JSON form of a tree that is a single output, held by ``leaf``."""
    spec = [1, {"type": None, "context": None, "children_spec": []}]
    return {"spec": spec, "leaves": [leaf], "count": 1}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"leaves": [], "count": 0}, "spec"),
        (
            {
                "spec": [1, {"type": "os.system", "context": "null", "children_spec": []}],
                "leaves": [],
                "count": 0,
            },
            "not an output tree",
        ),
        (_one_leaf_tree({"output": 3}), "refers past its 1 outputs"),
        (_one_leaf_tree({"file": "x"}), "kind is 'file'"),
        (_one_leaf_tree({"input": -1}), "non-negative"),
    ],
)
def test_a_malformed_tree_is_refused_with_the_reason(data, message) -> None:
    with pytest.raises(ValueError, match=message):
        OutputTree.from_dict(data)


def test_a_leaf_that_is_no_output_input_or_constant_is_refused() -> None:
    with pytest.raises(ValueError, match=r"leaf 0 is a Tensor that is neither"):
        OutputTree.of((torch.zeros(1),), (torch.zeros(1),), ())
    with pytest.raises(ValueError, match=r"no JSON form"):
        from collections import namedtuple

        OutputTree.of(namedtuple("P", "a")(1), (), ())
