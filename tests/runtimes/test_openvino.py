"""The ``openvino`` runtime: the ONNX artifact on OpenVINO's CPU plugin, through torch.compile."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import BUILD_COUNTS, assert_close_to_scale
from tests.models import MobileNetLike, ResNetLike, ViTLike, randomize_batchnorm

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)


def test_compiles_through_openvino_with_dynamic_batch_and_one_build():
    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "openvino"})
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 16, 16)
            assert_close_to_scale(compiled(x), model(x))
    assert BUILD_COUNTS["onnx"] == 1
    subs = embedl_dynamo.last_report().subgraphs
    assert {s.runtime for s in subs} == {"openvino"} and subs[-1].cached


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.relu(self.fc(x)))


def test_sequence_length_changes_reuse_the_artifact():
    model = _Tokens().eval()
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "openvino"})
    with torch.no_grad():
        for n in (5, 9, 5, 17):
            x = torch.randn(2, n, 8)
            assert_close_to_scale(compiled(x), model(x))
    assert BUILD_COUNTS["onnx"] == 2


def test_lifecycle_and_int8_qdq_artifact(tmp_path):
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    gm = embedl_dynamo.quantize(model, (x,), backend="onnxruntime", calibration_data=[x])
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path, num_threads=1)).build(gm, [x])
    assert runtime.active and runtime.input_names == ["input_0"]
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(
            runtime.infer(x)[0].flatten(), model(x).flatten(), dim=0
        )
    assert cosine > 0.99
    runtime.deactivate()
    with pytest.raises(RuntimeError, match="not active"):
        runtime.infer(x)


def test_inputs_are_set_on_the_request_not_dispatched_and_each_call_reads_its_own(monkeypatch):
    """A call sets each input as the request's tensor over the caller's memory and runs the
    request without inputs (OpenVINO's Python dispatch of ``infer(feeds)`` cost a small model's
    call several percent); batches of other sizes and new values in turn give their own
    outputs."""
    import openvino as ov

    model = _Tokens().eval()
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "openvino"})
    dispatched = []
    real_infer = ov.InferRequest.infer

    def infer(self, inputs=None, *args, **kwargs):
        dispatched.append(inputs)
        return real_infer(self, inputs, *args, **kwargs)

    with torch.no_grad():
        compiled(torch.randn(2, 5, 8))  # built (and checked) before the spy
        monkeypatch.setattr(ov.InferRequest, "infer", infer)
        for batch in (2, 3, 2):
            x = torch.randn(batch, 5, 8)
            out = compiled(x)
            x.add_(1.0)  # the caller's tensor changes after the call: the output does not
            assert_close_to_scale(out, model(x - 1.0))
    assert dispatched and all(inputs is None for inputs in dispatched), dispatched


def test_an_input_the_port_does_not_take_as_it_is_goes_through_the_dispatch(tmp_path):
    """float64 into a float32 port: the request refuses the shared tensor, OpenVINO's dispatch
    converts it."""
    import numpy as np
    import onnx
    import openvino as ov
    from onnx import TensorProto, helper

    from embedl_dynamo.runtimes.openvino.runtime import _run_shared

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "double.onnx"))
    compiled = ov.Core().compile_model(str(tmp_path / "double.onnx"), "CPU")
    request = compiled.create_infer_request()
    values = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = _run_shared(request, [values])[compiled.outputs[0]]
    np.testing.assert_array_equal(out, 2 * values)
    out = _run_shared(request, [np.ones((4, 3), np.float32)])[compiled.outputs[0]]
    np.testing.assert_array_equal(out, np.full((4, 3), 2.0, np.float32))


def test_openvino_errors_say_the_cause_not_the_source_file():
    from embedl_dynamo.runtimes.openvino.compile import openvino_cause

    error = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:117:\n"
        "Exception from src/inference/src/dev/plugin.cpp:53:\n"
        "[CPU] FakeQuantize node with name 'q_3' has unsupported input shape\n"
    )
    assert (
        openvino_cause(error)
        == "[CPU] FakeQuantize node with name 'q_3' has unsupported input shape"
    )
    assert (
        openvino_cause(RuntimeError("Exception from src/x.cpp:1:")) == "Exception from src/x.cpp:1:"
    )
    inference = RuntimeError(
        "Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
        "Check 'is_dynamic || port.get_shape() == tensor->get_shape()' failed at "
        "src/plugins/intel_cpu/src/infer_request.cpp:669:\n"
        "The input tensor size is not equal to the model input type: got [1] expecting [].\n"
    )
    assert openvino_cause(inference).startswith("The input tensor size is not equal")


def test_openvino_target_runs_every_conv_and_linear_in_int8(tmp_path):
    """NNCF's placement as our Q/DQ: OpenVINO's CPU plugin runs the depthwise convs, the
    squeeze-excite convs and the classifier as integer kernels, nothing in float between."""
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(1, 3, 32, 32)
    gm = embedl_dynamo.quantize(
        model,
        (x,),
        backend="openvino",
        calibration_data=[torch.randn(1, 3, 32, 32) for _ in range(3)],
    )
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path, num_threads=1)).build(gm, [x])
    precisions = runtime.layer_precisions()
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    int8_convs = sum(
        n for (kind, p), n in precisions.items() if kind == "Convolution" and p != "f32"
    )
    # every nn.Conv2d and the first classifier linear (a 1x1 conv after the pooling)
    assert int8_convs == convs + 1
    assert precisions[("Convolution", "f32")] == 0
    assert precisions[("Math", "f32")] == 0  # hardsigmoid is fused (see the lowering)
    assert runtime.build_info["int8_layers"]["Convolution"] == int8_convs
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(
            runtime.infer(x)[0].flatten(), gm(x).flatten(), dim=0
        )
    assert cosine > 0.995


@pytest.mark.parametrize(("alpha", "beta", "lowered"), [(1 / 6, 0.5, 1), (0.2, 0.5, 0)])
def test_hard_sigmoid_becomes_hsigmoid_with_equal_outputs(alpha, beta, lowered, tmp_path):
    import openvino as ov

    from embedl_dynamo.runtimes.openvino.lowering import lower_for_openvino

    class _Gate(nn.Module):
        def forward(self, x):
            return x * torch.clamp(alpha * x + beta, 0, 1) if alpha != 1 / 6 else F.hardsigmoid(x)

    x = torch.linspace(-5, 5, 64).reshape(1, 4, 4, 4)
    path = tmp_path / "gate.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Gate(), (x,), str(path), dynamo=False, opset_version=18)
    model = ov.Core().read_model(str(path))
    counts = lower_for_openvino(model)
    assert counts == ({"HardSigmoid": 1} if lowered else {})
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out = torch.from_numpy(compiled.create_infer_request().infer([x.numpy()])[0])
    assert float((out - _Gate()(x)).abs().max()) <= 1e-6


def _half_model(element_type: str):
    """An OpenVINO model ``relu(x) -> Convert(element_type) -> Convert(f32)``."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([2, 4], ov.Type.f32, name="x")
    half = ops.convert(ops.relu(x), element_type)
    return ov.Model([ops.convert(half, ov.Type.f32)], [x], "half")


@pytest.mark.parametrize(
    ("element_type", "capabilities", "expected"),
    [
        ("f32", ["BF16", "FP16", "FP32"], "f32"),  # a float file is never computed lower
        ("bf16", ["BF16", "FP32"], "bf16"),
        ("bf16", ["FP32"], "f32"),  # no bf16 arithmetic: the half weights computed in f32
        ("f16", ["BF16", "FP32"], "f32"),  # bf16 is not fp16's precision
        ("f16", ["FP16", "FP32"], "f16"),
    ],
)
def test_inference_precision_follows_the_file_and_the_cpu(element_type, capabilities, expected):
    from embedl_dynamo.runtimes.openvino.compile import inference_precision

    assert inference_precision(_half_model(element_type), capabilities) == expected


def _cpu_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bf16_runs_in_bf16_and_float_in_f32(precision, tmp_path):
    """``precision="bf16"`` computes in bf16 where the CPU can (not rejected by float's 1e-3
    check: it is judged by cosine to the float model); fp32 stays f32 on the same CPU, though
    OpenVINO's own default there would be bf16."""
    torch.manual_seed(0)
    model = ViTLike().eval()
    x = torch.randn(2, 3, 16, 16)
    options = {"runtime": "openvino", "precision": precision, "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        expected, got = model(x), compiled(x)
    sub = embedl_dynamo.last_report().subgraphs[0]
    bf16_cpu = "BF16" in _cpu_capabilities()
    assert sub.runtime == "openvino"
    if precision == "fp32":
        assert not sub.reason
    else:  # which form of the bf16 graph runs (tests/tuning/test_half_form.py)
        assert sub.reason.startswith("bf16 on openvino: ")
    assert got.dtype == torch.float32
    computes = "bf16" if precision == "bf16" and bf16_cpu else "f32"
    assert sub.runtime_info["inference_precision"] == computes
    cosine = F.cosine_similarity(got.flatten().double(), expected.flatten().double(), 0)
    assert cosine > (0.999 if precision == "bf16" else 0.999999)


def test_an_int8_file_with_a_bf16_rest_runs_its_float_layers_in_bf16(tmp_path):
    """The rest precision travels in the ONNX file's metadata: OpenVINO computes the INT8
    graph's unquantized layers in bf16 where the CPU can, and in f32 (saying so) where not."""
    import onnx

    from embedl_dynamo.graph.rest_precision import ONNX_REST_PRECISION, with_rest_precision
    from embedl_dynamo.runtimes.openvino.compile import inference_precision

    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    gm = embedl_dynamo.quantize(model, (x,), backend="openvino", calibration_data=[x])
    settings = Settings(cache_dir=tmp_path, num_threads=1)
    plain = OpenVINORuntime(settings).build(gm, [x])
    rest = OpenVINORuntime(settings).build(with_rest_precision(gm, "bf16"), [x])
    assert plain.key() != rest.key()  # the same graph, another file
    props = {p.key: p.value for p in onnx.load(rest.build_info["artifact"]).metadata_props}
    assert props[ONNX_REST_PRECISION] == "bf16"
    assert plain.build_info["inference_precision"] == "f32"
    bf16_cpu = "BF16" in _cpu_capabilities()
    assert rest.build_info["inference_precision"] == ("bf16" if bf16_cpu else "f32")
    import openvino as ov

    read = ov.Core().read_model(rest.build_info["artifact"])
    assert inference_precision(read, ["BF16", "FP32"]) == "bf16"
    assert inference_precision(read, ["FP32"]) == "f32"
    assert "int8" in rest.module_precisions().values()
    # a float graph with a bf16 rest: its convolutions run in bf16 where the CPU can
    float_rest = with_rest_precision(torch.fx.symbolic_trace(model), "bf16")
    ran = OpenVINORuntime(settings).build(float_rest, [x]).module_precisions()
    assert ran and ("bf16" in ran.values() if bf16_cpu else set(ran.values()) == {"fp32"})
    with torch.no_grad():
        cosine = F.cosine_similarity(rest.infer(x)[0].flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.99


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_a_static_dynamo_graph_compiles_for_its_sizes_and_checks_other_sizes_dynamically(
    precision,
):
    """Dynamo calls a graph it traced with constant sizes with those sizes only (a new size
    compiles a symbolic graph): OpenVINO builds a float or half graph for them. The compile's
    own checks on calibration batches of another size run the file's dynamic model, released
    once served. A Q/DQ graph stays dynamic: fixed sizes left INT8 layers in f32."""
    model = randomize_batchnorm(ResNetLike().eval())
    g = torch.Generator().manual_seed(0)
    calibration = [torch.randn(4, 3, 16, 16, generator=g) for _ in range(2)]
    options = {"runtime": "openvino", "precision": precision, "calibration_data": calibration}
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        for batch in (2, 3, 2):
            x = torch.randn(batch, 3, 16, 16)
            out = compiled(x)
            cosine = F.cosine_similarity(out.flatten(), model(x).flatten(), dim=0)
            assert cosine > 0.99
    first, second = embedl_dynamo.last_report().subgraphs
    assert first.runtime == second.runtime == "openvino"
    assert "rejected" not in first.reason
    static = first.runtime_info.get("static_shapes")
    assert static == ([[2, 3, 16, 16]] if precision == "bf16" else None)
    assert "static_shapes" not in second.runtime_info  # the symbolic graph: any batch
