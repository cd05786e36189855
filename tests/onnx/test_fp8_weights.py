"""FP8 in the ONNX file: weights folded to FP8 initializers, FP8 detection, the opset rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from embedl_dynamo.onnx.fp8_weights import fold_fp8_weights, fp8_opset, has_fp8_qdq
from embedl_dynamo.quant.fp8.qdq import FP8FakeQuantize
from embedl_dynamo.runtimes.onnxruntime.session import create_session


def _weight_qdq_model(zero_type: int) -> tuple:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 8)) * np.array([[0.01], [0.1], [1.0], [600.0]])).astype(np.float32)
    scale = (np.abs(w).max(axis=1) / 448.0).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], axis=0),
            helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], axis=0),
            helper.make_node("MatMul", ["x", "wd"], ["y"]),
        ],
        "w",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(scale, "s"),
            helper.make_tensor("z", zero_type, [4], [0] * 4),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model, np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)


def test_fp8_weights_fold_to_the_values_quantize_linear_computes():
    model, x = _weight_qdq_model(TensorProto.FLOAT8E4M3FN)
    before = create_session(model.SerializeToString()).run(None, {"x": x})[0]
    assert fold_fp8_weights(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["DequantizeLinear", "MatMul"]
    (folded,) = [i for i in model.graph.initializer if i.name == "w_fp8"]
    assert folded.data_type == TensorProto.FLOAT8E4M3FN
    assert "w" not in {i.name for i in model.graph.initializer}
    after = create_session(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(after, before)


def test_int8_weights_are_not_fp8_folded_and_files_are_told_apart(tmp_path):
    model, _ = _weight_qdq_model(TensorProto.INT8)
    assert fold_fp8_weights(model) == 0 and not has_fp8_qdq(model.SerializeToString())
    fp8, _ = _weight_qdq_model(TensorProto.FLOAT8E4M3FN)
    path = tmp_path / "fp8.onnx"
    path.write_bytes(fp8.SerializeToString())
    assert has_fp8_qdq(path) and has_fp8_qdq(fp8)
    float_model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "f",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
    )
    assert not has_fp8_qdq(float_model.SerializeToString())
    broken = tmp_path / "broken.onnx"  # a file that is no model: ONNX Runtime names the problem
    broken.write_bytes(b"\x3a\x12\x0a\x10QuantizeLinear\xff")
    assert not has_fp8_qdq(broken) and not has_fp8_qdq(tmp_path / "missing.onnx")


def test_an_fp8_graph_exports_at_opset_19_or_later():
    fp8 = torch.nn.Sequential(FP8FakeQuantize(1.0))
    assert fp8_opset(torch.nn.Linear(2, 2), None, 17) == 17
    assert fp8_opset(fp8, None, 17) == 19 and fp8_opset(fp8, 21, 17) == 21
    with pytest.raises(ValueError, match="opset 19 or later, not 18; pass opset=19"):
        fp8_opset(fp8, 18, 17)
