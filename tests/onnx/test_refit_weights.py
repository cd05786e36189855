"""New weights into an exported ONNX graph: each initializer from the constant it was exported
from; what cannot be proved to be what a new export writes is refused, with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from embedl_dynamo.graph.weight_recipe import tensor_digest
from embedl_dynamo.onnx.int8_weights import fold_int8_weights
from embedl_dynamo.onnx.refit_weights import refit_initializers, replace_initializers

F = TensorProto.FLOAT


def _model(nodes, initializers, inputs=("x",), outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, [4]) for n in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, **feeds: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_constants_the_exporter_merged_get_an_initializer_each():
    """Equal biases at export were one initializer and an Identity; the new ones differ."""
    zeros = np.zeros(4, np.float32)
    model = _model(
        [
            helper.make_node("Identity", ["gm.a"], ["gm.b"]),
            helper.make_node("Add", ["x", "gm.a"], ["s"]),
            helper.make_node("Add", ["s", "gm.b"], ["y"]),
        ],
        {"gm.a": zeros},
    )
    a, b = torch.ones(4), torch.full((4,), 10.0)
    values = refit_initializers(model, {"a": a, "b": b}, {}, {})
    replace_initializers(model, values)
    assert not [n for n in model.graph.node if n.op_type == "Identity"]
    x = np.zeros(4, np.float32)
    np.testing.assert_array_equal(_run(model, x=x)[0], np.full(4, 11.0, np.float32))


def test_a_constant_no_weight_decides_keeps_its_value_when_its_twin_changes():
    model = _model(
        [
            helper.make_node("Identity", ["gm.w"], ["gm.c"]),
            helper.make_node("Add", ["x", "gm.w"], ["s"]),
            helper.make_node("Mul", ["s", "gm.c"], ["y"]),
        ],
        {"gm.w": np.ones(4, np.float32)},
    )
    c = torch.ones(4)
    values = refit_initializers(model, {"w": torch.full((4,), 3.0)}, {"c": tensor_digest(c)}, {})
    replace_initializers(model, values)
    out = _run(model, x=np.zeros(4, np.float32))[0]
    np.testing.assert_array_equal(out, np.full(4, 3.0, np.float32))  # (0 + 3) * 1


def test_a_weight_the_exporter_folded_into_another_constant_is_refused():
    """x @ w.T exported as MatMul of the folded transpose: no initializer holds w."""
    model = _model(
        [helper.make_node("MatMul", ["x", "onnx::MatMul_5"], ["y"])],
        {"onnx::MatMul_5": np.ones((4, 4), np.float32)},
    )
    with pytest.raises(ValueError, match="weight-derived constant w is not an initializer"):
        refit_initializers(model, {"w": torch.ones(4, 4)}, {}, {})


def test_an_exporter_computed_float_initializer_is_refused_even_beside_the_weight():
    """The weight is used as itself and transposed (a tied embedding): the folded copy would
    keep the old values."""
    model = _model(
        [
            helper.make_node("Add", ["x", "gm.w"], ["s"]),
            helper.make_node("Mul", ["s", "onnx::Mul_7"], ["y"]),
        ],
        {"gm.w": np.ones(4, np.float32), "onnx::Mul_7": np.ones(4, np.float32)},
    )
    with pytest.raises(ValueError, match="onnx::Mul_7 .* computed by the ONNX exporter"):
        refit_initializers(model, {"w": torch.zeros(4)}, {}, {})


def test_a_constant_the_recipe_cannot_compute_is_refused():
    model = _model(
        [helper.make_node("Add", ["x", "gm.w"], ["y"])], {"gm.w": np.ones(4, np.float32)}
    )
    with pytest.raises(ValueError, match="smoothed cannot be recomputed .*activations"):
        refit_initializers(model, {"w": torch.ones(4)}, {}, {"smoothed": "activations"})


def _int8_weight(zero_points: tuple[str, str]) -> onnx.ModelProto:
    """Two int8 weights, folded at export, each DequantizeLinear'd with its scale and a zero
    point (``zero_points``: the names each reads)."""
    nodes, inits = [], {}
    for k, zp in zip("ab", zero_points):
        inits[f"gm.{k}.parametrizations.weight.original_int8"] = np.ones(4, np.int8)
        inits[f"gm.{k}.parametrizations.weight.0.scale"] = np.float32(0.5)
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [
                    f"gm.{k}.parametrizations.weight.original_int8",
                    f"gm.{k}.parametrizations.weight.0.scale",
                    zp,
                ],
                [f"w_{k}"],
            )
        )
    inits["zp"] = np.int8(0)
    inits["zp2"] = np.int8(0)
    nodes += [
        helper.make_node("Add", ["x", "w_a"], ["s"]),
        helper.make_node("Add", ["s", "w_b"], ["y"]),
    ]
    return _model(nodes, inits)


def test_int8_weights_are_folded_again_from_their_new_scale_and_zero_point():
    model = _int8_weight(("zp", "zp2"))
    derived = {}
    for k, value in (("a", 1.0), ("b", -2.0)):
        derived[f"{k}.parametrizations.weight.original"] = torch.full((4,), value)
        derived[f"{k}.parametrizations.weight.0.scale"] = torch.tensor(value / 100)
        derived[f"{k}.parametrizations.weight.0.zero_point"] = torch.tensor(0, dtype=torch.int32)
    values = refit_initializers(model, derived, {}, {})
    np.testing.assert_array_equal(values["gm.a.parametrizations.weight.original_int8"], 100)
    np.testing.assert_array_equal(values["gm.b.parametrizations.weight.original_int8"], 100)
    replace_initializers(model, values)
    out = _run(model, x=np.zeros(4, np.float32))[0]
    np.testing.assert_allclose(out, np.full(4, -1.0, np.float32))
    assert fold_int8_weights(model) == 0  # nothing left to fold: the codes are stored


def test_a_zero_point_two_quantizers_share_that_would_now_differ_is_refused():
    model = _int8_weight(("zp", "zp"))
    derived = {
        f"{k}.parametrizations.weight.0.zero_point": torch.tensor(zp, dtype=torch.int32)
        for k, zp in (("a", 0), ("b", 3))
    }
    with pytest.raises(ValueError, match="zero point zp is read by quantizers that now differ"):
        refit_initializers(model, derived, {}, {})


def test_a_bfloat16_weight_keeps_its_type_and_gets_its_new_bits():
    """numpy has no bfloat16: the initializer is written from the tensor's bits, typed as it
    was in the file."""
    proto = helper.make_tensor("gm.w", TensorProto.BFLOAT16, [4], [0, 0, 0, 0])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["gm.w"], ["y"], to=F)],
        "g",
        [],
        [helper.make_tensor_value_info("y", F, [4])],
        [proto],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    w = torch.tensor([1.5, -2.0, 3.25, 0.0], dtype=torch.bfloat16)
    replace_initializers(model, refit_initializers(model, {"w": w}, {}, {}))
    written = model.graph.initializer[0]
    assert written.data_type == TensorProto.BFLOAT16 and list(written.dims) == [4]
    assert written.raw_data == w.view(torch.int16).numpy().tobytes()
    with pytest.raises(ValueError, match="initializer gm.w is torch.bfloat16"):
        refit_initializers(model, {"w": w.float()}, {}, {})
