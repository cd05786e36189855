"""The TensorRT lint's int4 weight rules (:func:`~embedl_dynamo.runtimes.tensorrt.lint.
int4_weight_problems`): what TensorRT's weight-only INT4 takes, and what it refuses and why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt

K, N, BLOCK = 64, 16, 32


def _model(
    codes_type: int = TensorProto.INT4,
    axis: int = 0,
    scale_shape: tuple[int, ...] = (K // BLOCK, N),
    reader: str = "MatMul",
) -> onnx.ModelProto:
    codes = helper.make_tensor("w_q", codes_type, [K, N], np.ones(K * N, np.int64).tolist())
    scale = numpy_helper.from_array(np.full(scale_shape, 0.1, np.float32), "w_s")
    dq = helper.make_node(
        "DequantizeLinear", ["w_q", "w_s"], ["w"], name="dq", axis=axis, block_size=BLOCK
    )
    use = helper.make_node(reader, ["x", "w"] if reader == "MatMul" else ["w", "w"], ["y"])
    x_shape = [2, K] if reader == "MatMul" else [K, N]
    graph = helper.make_graph(
        [dq, use],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], N])],
        [codes, scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_blocked_int4_matmul_weight_passes():
    model = _model()
    onnx.checker.check_model(model)
    assert lint_for_tensorrt(model) == []


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"codes_type": TensorProto.UINT4}, "uint4 weights; TensorRT's INT4 is signed"),
        ({"axis": 1, "scale_shape": (K, N // BLOCK)}, "blocked on axis 0"),
        ({"scale_shape": (K // 16, N)}, "are not [K / block_size, N]"),
        ({"reader": "Add"}, "read only as a MatMul/Gemm weight"),
    ],
)
def test_int4_weight_tensorrt_refuses_is_named(kwargs, problem):
    problems = lint_for_tensorrt(_model(**kwargs))
    assert any(problem in p and p.startswith("DequantizeLinear dq") for p in problems), problems


def test_an_int8_dequantize_is_not_judged_by_the_int4_rules():
    """No match: 8-bit weights keep the per-channel rules only."""
    model = _model(codes_type=TensorProto.INT8, reader="Add")
    assert not any("int4" in p for p in lint_for_tensorrt(model))
