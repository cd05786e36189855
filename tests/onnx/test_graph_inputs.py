"""Inputs the graph does not read stay inputs of the exported file, in their place."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import fx, nn

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.export import export_onnx, input_names
from embedl_dynamo.onnx.graph_inputs import restore_dropped_inputs


class _SkipsTheMiddle(nn.Module):
    """Reads its first and last input only, as a graph whose counter only a number output
    reads (computed in PyTorch) passes the counter to the artifact unread."""

    def forward(self, x: torch.Tensor, counter: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y


def test_an_unread_input_is_declared_in_its_place_and_the_file_runs(tmp_path):
    args = (torch.randn(2, 3), torch.tensor(4), torch.randn(2, 3))
    axes = DynamicAxes(({0: "batch"}, {}, {0: "batch"}), ({0: "batch"},))
    path = export_onnx(
        fx.symbolic_trace(_SkipsTheMiddle()),
        args,
        tmp_path / "m.onnx",
        exporter="torchscript",
        dynamic_axes=axes,
    )
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == input_names(3)
    counter = model.graph.input[1].type.tensor_type
    assert counter.elem_type == onnx.TensorProto.INT64 and len(counter.shape.dim) == 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x, y = np.ones((5, 3), np.float32), np.full((5, 3), 0.5, np.float32)
    (out,) = session.run(None, dict(zip(input_names(3), (x, np.array(4), y))))
    np.testing.assert_allclose(out, x * 2 + y)


def test_nothing_changes_when_every_input_is_read():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["input_0"], ["output_0"])],
        "g",
        [onnx.helper.make_tensor_value_info("input_0", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("output_0", onnx.TensorProto.FLOAT, [2])],
    )
    model = onnx.helper.make_model(graph)
    assert restore_dropped_inputs(model, ["input_0"], [torch.zeros(2)], {}) == 0
    assert [i.name for i in model.graph.input] == ["input_0"]


def test_a_dropped_input_keeps_its_dynamic_axis_by_name():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["input_1"], ["output_0"])],
        "g",
        [onnx.helper.make_tensor_value_info("input_1", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("output_0", onnx.TensorProto.FLOAT, [2])],
    )
    model = onnx.helper.make_model(graph)
    args = [torch.zeros(3, 4, dtype=torch.float16), torch.zeros(2)]
    restored = restore_dropped_inputs(model, input_names(2), args, {"input_0": {0: "batch"}})
    assert restored == 1
    first = model.graph.input[0]
    assert first.name == "input_0" and first.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert [d.dim_param or d.dim_value for d in first.type.tensor_type.shape.dim] == ["batch", 4]
