"""The TensorRT lint's FP8 rules (:func:`embedl_dynamo.runtimes.tensorrt.lint.lint_fp8`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt


def _fp8_conv_file(
    *,
    opset: int = 19,
    zero_type: int = TensorProto.FLOAT8E4M3FN,
    channels: tuple[int, int] = (32, 32),
    group: int = 1,
    kernel: int = 3,
    consumer: str = "Conv",
) -> onnx.ModelProto:
    """x -> Q/DQ (FP8) -> ``consumer`` (a Conv with an FP8 weight read by DequantizeLinear, or
    a one-input op such as GlobalAveragePool)."""
    out_ch, in_ch = channels
    w = np.ones((out_ch, in_ch // group, kernel, kernel), np.float32)
    init = [
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("z", zero_type, [], [0]),
        numpy_helper.from_array(np.full(out_ch, 0.01, np.float32), "ws"),
        helper.make_tensor("wz", zero_type, [out_ch], [0] * out_ch),
        helper.make_tensor("w8", zero_type, list(w.shape), w.ravel().tolist()),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w8", "ws", "wz"], ["wd"], name="dq_w", axis=0),
    ]
    if consumer == "Conv":
        nodes.append(
            helper.make_node(
                "Conv", ["xd", "wd"], ["y"], name="conv", group=group, pads=[kernel // 2] * 4
            )
        )
        out_shape = [1, out_ch, 8, 8]
    else:
        nodes = nodes[:2] + [helper.make_node(consumer, ["xd"], ["y"], name="pool")]
        out_shape = [1, in_ch, 1, 1]
    graph = helper.make_graph(
        nodes,
        "fp8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, in_ch, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        init if consumer == "Conv" else init[:2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def test_an_fp8_conv_tensorrt_runs_passes():
    assert lint_for_tensorrt(_fp8_conv_file()) == []


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"opset": 18}, "float8 types need opset 19"),
        ({"zero_type": TensorProto.FLOAT8E5M2}, "FLOAT8E5M2 zero point; TensorRT's FP8 is E4M3FN"),
        ({"consumer": "GlobalAveragePool"}, "dq_x: FP8 feeds no Conv/Gemm/MatMul or residual Add"),
        ({"channels": (32, 3)}, "3 input (per group) / 32 output channels, not both above 16"),
        ({"group": 2}, "16 input (per group) / 32 output channels"),
        ({"kernel": 7}, "a filter of 49 taps, above 32"),
    ],
    ids=["opset", "e5m2", "pooling", "channels", "grouped", "filter"],
)
def test_each_fp8_rule_names_the_problem(kwargs, problem):
    problems = lint_for_tensorrt(_fp8_conv_file(**kwargs))
    assert any(problem in p for p in problems), problems


def test_an_int8_file_is_not_held_to_the_fp8_rules():
    model = _fp8_conv_file(zero_type=TensorProto.INT8, channels=(32, 3), consumer="Conv")
    assert lint_for_tensorrt(model) == []


def test_fp8_into_a_residual_add_passes():
    """TensorRT fuses it into the layer producing the other input (ModelOpt's Residual-Add)."""
    model = _fp8_conv_file()
    add = onnx.helper.make_node("Add", ["xd", "y"], ["z"], name="residual")
    model.graph.node.append(add)
    model.graph.output[0].name = "z"
    assert lint_for_tensorrt(model) == []
