"""A served model's output structure as named KServe v2 tensors (:mod:`embedl_dynamo.serve.outputs`):
stable names from the structure, ``None`` left out and recorded, the ONNX names where the
structure is the file's own flat outputs, and the structure back for a Python caller."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedl_dynamo.graph.output_tree import OutputTree
from embedl_dynamo.serve.kserve import TensorSpec
from embedl_dynamo.serve.outputs import ServedOutputs

GRAPH = [TensorSpec(f"output_{i}", "FP32", (-1, 3)) for i in range(3)]
INPUTS = [TensorSpec("input_0", "FP32", (-1, 4))]


def _served(returned, graph_outputs, inputs=()) -> ServedOutputs:
    tree = OutputTree.of(returned, graph_outputs, list(inputs))
    return ServedOutputs(tree, GRAPH[: len(graph_outputs)], INPUTS)


def test_a_transformers_like_structure_gets_path_names_and_none_is_recorded():
    a, k, v = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    served = _served({"logits": a, "past_key_values": ((k, v),), "aux": None}, [a, k, v])
    assert [s.name for s in served.specs] == [
        "logits",
        "past_key_values.0.0",
        "past_key_values.0.1",
    ]
    assert [s.shape for s in served.specs] == [(-1, 3)] * 3
    assert served.omitted == [("aux", None)]
    outputs = [np.full((2, 3), float(i)) for i in range(3)]
    answer = served.arrays(outputs, [np.zeros((2, 4))])
    assert [float(x[0, 0]) for x in answer] == [0.0, 1.0, 2.0]
    back = served.structure(outputs, [np.zeros((2, 4))])
    assert set(back) == {"logits", "past_key_values", "aux"} and back["aux"] is None
    assert back["past_key_values"][0][1] is outputs[2]


@pytest.mark.parametrize("shape", ["tensor", "tuple", "none"])
def test_the_files_own_flat_outputs_keep_their_onnx_names(shape):
    a, b = torch.zeros(1), torch.ones(1)
    if shape == "none":
        served = ServedOutputs(None, GRAPH[:2], INPUTS)
    elif shape == "tensor":
        served = _served(a, [a])
    else:
        served = _served((a, b), [a, b])
    count = 1 if shape == "tensor" else 2
    assert [s.name for s in served.specs] == [f"output_{i}" for i in range(count)]
    assert served.omitted == []
    outputs = [np.ones((1, 3)) * i for i in range(count)]
    back = served.structure(outputs, [])
    if count == 1:
        assert back is outputs[0]  # one array, as load() gives one tensor
    else:
        assert isinstance(back, tuple) and back[1] is outputs[1]


def test_a_reordered_or_partial_tuple_is_named_by_position():
    a, b = torch.zeros(1), torch.ones(1)
    served = _served((b, None, a), [a, b])
    assert [s.name for s in served.specs] == ["0", "2"]
    assert served.omitted == [("1", None)]
    answer = served.arrays([np.zeros(1), np.ones(1)], [])
    assert [float(x[0]) for x in answer] == [1.0, 0.0]


def test_an_input_returned_as_it_is_is_answered_from_the_request():
    x, y = torch.zeros(2, 4), torch.ones(2, 3)
    served = _served({"y": y, "x": x}, [y], [x])
    assert [s.to_dict() for s in served.specs] == [
        {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
    ]
    request = np.full((2, 4), 7.0)
    assert served.arrays([np.ones((2, 3))], [request])[1] is request


def test_paths_that_spell_one_name_fall_back_to_leaf_positions():
    a, b = torch.zeros(1), torch.ones(1)
    served = _served({"a.b": a, "a": {"b": b}}, [a, b])
    assert sorted(s.name for s in served.specs) == ["leaf_0", "leaf_1"]
