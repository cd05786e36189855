"""QuantizationSpec / QuantizationConfig: validation, JSON round trip, Backend.to_dict."""

from __future__ import annotations

import json

import pytest

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.onnxruntime import BACKEND as ORT
from embedl_dynamo.backends.tensorrt import BACKEND as TRT
from embedl_dynamo.quant.int8.spec import (
    ONNXRUNTIME_INT8,
    TENSORRT_INT8,
    QuantizationConfig,
    QuantizationSpec,
)
from embedl_dynamo.rewrite.qdq import Role


def test_spec_grids():
    w = TENSORRT_INT8.spec(Role.WEIGHT)
    assert (w.qmin, w.qmax, w.per_channel, w.axis) == (-127, 127, True, 0)
    a = ONNXRUNTIME_INT8.spec(Role.ACTIVATION)
    assert (a.qmin, a.qmax, a.symmetric) == (0, 255, False)
    assert TENSORRT_INT8.spec(Role.OUTPUT) == TENSORRT_INT8.spec(Role.ACTIVATION)
    assert TENSORRT_INT8.spec(Role.BIAS) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int4"}, "unknown dtype 'int4'; known: \\['int8', 'uint8'\\]"),
        ({"observer": "magic"}, "unknown observer 'magic'; known"),
        ({"per_channel": True}, "per-channel spec needs an axis"),
        ({"axis": 0}, "set per_channel=True"),
        ({"percentile": 10.0}, "percentile must be in"),
        ({"dtype": "uint8", "narrow_range": True}, "narrow_range applies to int8 only"),
        ({"symmetric": False, "unsigned_nonnegative": True}, "symmetric int8 specs only"),
        (
            {"per_channel": True, "axis": 0, "unsigned_nonnegative": True},
            "per-tensor \\(activation\\) specs only",
        ),
    ],
)
def test_spec_validates_itself(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QuantizationSpec(**kwargs)


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        TENSORRT_INT8.spec(Role.WEIGHT).dtype = "uint8"  # type: ignore[misc]


def test_config_needs_activation_and_weight():
    with pytest.raises(ValueError, match="needs a spec for 'weight'"):
        QuantizationConfig({Role.ACTIVATION: QuantizationSpec()})
    with pytest.raises(TypeError, match="must be a QuantizationSpec"):
        QuantizationConfig({Role.ACTIVATION: "int8", Role.WEIGHT: QuantizationSpec()})


def test_config_json_round_trip():
    for config in (TENSORRT_INT8, ONNXRUNTIME_INT8, TENSORRT_INT8.with_observer("mse")):
        text = json.dumps(config.to_dict())
        assert QuantizationConfig.from_dict(json.loads(text)) == config
    with pytest.raises(ValueError, match="unknown role 'gate'; known"):
        QuantizationConfig.from_dict({"specs": {"gate": {}}})
    with pytest.raises(ValueError, match="unknown QuantizationSpec fields \\['bits'\\]"):
        QuantizationSpec.from_dict({"bits": 4})


def test_with_observer_changes_activations_only():
    config = TENSORRT_INT8.with_observer("percentile")
    assert config.spec(Role.ACTIVATION).observer == "percentile"
    assert config.spec(Role.WEIGHT).observer == "minmax"


def test_backends_carry_their_config_and_round_trip():
    for backend, config in ((TRT, TENSORRT_INT8), (ORT, ONNXRUNTIME_INT8)):
        data = json.loads(json.dumps(backend.to_dict()))
        assert data["quantization"] == config.to_dict()
        assert data["quantized_patterns"]
        assert Backend.from_dict(data).quantization == config
    assert TRT.to_dict()["smooth_patterns"] == ["smooth_layernorm_linear"]


def test_unsigned_nonnegative_takes_uint8_from_zero_for_a_nonnegative_range():
    from embedl_dynamo.quant.int8.observers import scale_zero_point
    from embedl_dynamo.quant.int8.spec import OPENVINO_INT8

    spec = OPENVINO_INT8.spec(Role.ACTIVATION)
    assert spec.for_range(-0.5) is spec  # signed data keeps the symmetric int8 grid
    unsigned = spec.for_range(0.0)
    assert (unsigned.dtype, unsigned.qmin, unsigned.qmax, unsigned.symmetric) == (
        "uint8",
        0,
        255,
        False,
    )
    scale, zero_point = scale_zero_point(unsigned, 0.0, 6.0)
    signed_scale, _ = scale_zero_point(spec, -6.0, 6.0)
    assert int(zero_point) == 0 and float(scale) == pytest.approx(6.0 / 255)
    assert float(signed_scale) == pytest.approx(6.0 / 127)  # twice as coarse for relu6 data
    assert TENSORRT_INT8.spec(Role.ACTIVATION).for_range(0.0).dtype == "int8"
