"""Tests for :mod:`embedl_dynamo.graph.output_tree`: the model's output structure over its
graph's flat outputs, recorded at capture and written as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.output_tree import OUTPUT_TREE_META, OutputTree

ROOT = Path(__file__).resolve().parents[2]


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


def _keyed_tree(type_name: str, context: str) -> dict:
    leaf = {"type": None, "context": None, "children_spec": []}
    spec = [1, {"type": type_name, "context": context, "children_spec": [leaf, leaf]}]
    return {"spec": spec, "leaves": [{"output": 0}, {"output": 1}], "count": 2}


def test_an_unregistered_keyed_type_comes_back_as_a_dict_with_one_warning(caplog) -> None:
    """A type no process registered (not of a known package) keeps its keys."""
    tree = OutputTree.from_dict(_keyed_tree("elsewhere.Output", '["logits", "hidden"]'))
    assert tree.rebuild(("a", "b"), ()) == {"logits": "a", "hidden": "b"}
    warned = [r for r in caplog.records if "elsewhere.Output" in r.getMessage()]
    assert len(warned) == 1 and "dicts with the same keys" in warned[0].getMessage()


def test_an_unregistered_type_without_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="elsewhere.Pair is not registered"):
        OutputTree.from_dict(_keyed_tree("elsewhere.Pair", "null"))


_FRESH_PROCESS = """
import sys, torch, embedl_dynamo
module = embedl_dynamo.load(sys.argv[1])
out = module(torch.ones(2, 4))
print(type(out).__module__, type(out).__name__, sorted(out.keys()))
"""


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_a_transformers_output_rebuilds_in_a_process_that_never_imported_it(tmp_path) -> None:
    """transformers registers a ``ModelOutput`` class when its module is imported: ``load()``
    in a fresh process (a serving replica) imports it from transformers by its name."""
    outputs = pytest.importorskip("transformers.modeling_outputs")

    class Encoder(nn.Module):
        def forward(self, x: torch.Tensor):
            return outputs.BaseModelOutputWithPooling(last_hidden_state=x * 2, pooler_output=x)

    path = export(Encoder().eval(), torch.ones(2, 4), tmp_path / "e.onnx", backend="onnxruntime")
    found = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == [
        "transformers.modeling_outputs",
        "BaseModelOutputWithPooling",
        "['last_hidden_state',",
        "'pooler_output']",
    ]
