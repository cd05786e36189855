"""The ONNX lint for the TensorRT target (``onnx`` only): our INT8/FP16 exports pass, and each
rule catches the file that breaks it, naming the node."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from embedl_dynamo.deploy.export import export, sidecar_path
from embedl_dynamo.runtimes.tensorrt.lint import SUPPORTED_OPS, lint_for_tensorrt
from tests.models import ResNetLike, ViTLike, randomize_batchnorm


@pytest.mark.parametrize("make", [ResNetLike, ViTLike])
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_our_tensorrt_exports_pass_and_the_sidecar_says_so(make, precision, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    if make is ResNetLike:
        randomize_batchnorm(model)
    x = torch.randn(2, 3, 16, 16)
    path = export(
        model, x, tmp_path / "m.onnx", precision=precision, calibration_data=[x], progress=False
    )
    assert lint_for_tensorrt(onnx.load(str(path))) == []
    assert json.loads(sidecar_path(path).read_text())["tensorrt_lint"] == []
    if precision == "int8":  # really checked: the file has Q/DQ with constant scales
        ops = {n.op_type for n in onnx.load(str(path)).graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def _model(nodes, initializers, opset=17, domain_opsets=()):
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [value("y", TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    opsets = [helper.make_opsetid("", opset), *domain_opsets]
    return helper.make_model(graph, opset_imports=opsets)


def _t(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _qdq(zero=0, scale=0.1, quantize_weight=False, axis=0):
    weight = np.ones((2, 2, 1, 1), np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_x"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wdq"], name="dq_w", axis=axis),
        helper.make_node("Conv", ["dq", "wdq"], ["y"], name="conv"),
    ]
    inits = [
        _t("s", np.float32(scale)),
        _t("z", np.int8(zero)),
        _t("w", weight),
        _t("ws", np.full(2, 0.1, np.float32)),
        _t("wz", np.zeros(2, np.int8)),
    ]
    if quantize_weight:
        nodes.insert(0, helper.make_node("QuantizeLinear", ["wf", "ws", "wz"], ["w"], name="q_w"))
        inits = [i for i in inits if i.name != "w"] + [_t("wf", weight.astype(np.float32))]
    return _model(nodes, inits)


def test_each_rule_names_the_node_it_refuses():
    assert lint_for_tensorrt(_qdq()) == []
    assert any("q_x" in p and "zero point" in p for p in lint_for_tensorrt(_qdq(zero=3)))
    assert any("scale" in p and "non-positive" in p for p in lint_for_tensorrt(_qdq(scale=-1.0)))
    assert any(
        "q_w" in p and "quantizes a constant" in p
        for p in lint_for_tensorrt(_qdq(quantize_weight=True))
    )
    assert any("dq_w" in p and "axis 1" in p for p in lint_for_tensorrt(_qdq(axis=1)))
    old = _qdq()
    old.opset_import[0].version = 22
    assert any("opset 22" in p for p in lint_for_tensorrt(old))


def test_unsupported_and_foreign_ops_are_named():
    nodes = [
        helper.make_node("Unique", ["x"], ["u"], name="unique"),
        helper.make_node("Gelu", ["x"], ["y"], name="msgelu", domain="com.microsoft"),
    ]
    problems = lint_for_tensorrt(
        _model(nodes, [], domain_opsets=[helper.make_opsetid("com.microsoft", 1)])
    )
    assert any("unique" in p and "supported operators" in p for p in problems)
    assert any("msgelu" in p and "com.microsoft" in p for p in problems)
    assert {"Conv", "QuantizeLinear", "LayerNormalization", "Gelu"} <= SUPPORTED_OPS
