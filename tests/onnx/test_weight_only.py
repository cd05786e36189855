"""Weight-only layers in the ONNX file (:mod:`embedl_dynamo.onnx.weight_only`) and the integer
kernels each runtime makes of them: ONNX Runtime's ``MatMulNBits`` and OpenVINO's compressed
``FullyConnected``, counted in their optimised graphs; TensorRT's lint takes the int4 file."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper
from torch import nn

from embedl_dynamo.backend import as_backend
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.onnx.weight_only import store_weight_only, weight_only_layers
from embedl_dynamo.quant.weight_only.codes import WeightOnlySpec
from embedl_dynamo.quant.weight_only.linear import weight_only_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.runtimes.onnxruntime.session import create_session
from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt

ort = pytest.importorskip("onnxruntime")


class Mlp(nn.Module):
    """A decoder MLP on [batch, seq, hidden] activations: gate/up/down projections and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(128, 256, bias=False)
        self.up = nn.Linear(128, 256, bias=False)
        self.down = nn.Linear(256, 128)
        self.head = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.down(F.silu(self.gate(x)) * self.up(x)))


def _x() -> torch.Tensor:
    return torch.randn(1, 7, 128, generator=torch.Generator().manual_seed(1))


def _export(tmp_path, spec: WeightOnlySpec, backend: str = "onnxruntime"):
    torch.manual_seed(0)
    model = Mlp().eval()
    target = as_backend(backend)
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    gm = apply_transformation_plan(plan_transformation(model, patterns, args=(_x(),))).model
    quantized, report = weight_only_graph(gm, [_x()], spec)
    path = export_onnx(quantized, [_x()], tmp_path / "mlp.onnx")
    return quantized, path, report


def _dequantize_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear"]


def _ort_optimised(path, tmp_path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    options.log_severity_level = 3
    create_session(path, ["CPUExecutionProvider"], options=options)  # our accuracy_level option
    return onnx.load(str(tmp_path / "optimised.onnx"))


@pytest.mark.parametrize(
    ("bits", "symmetric", "codes_type", "opset"),
    [
        (4, False, TensorProto.UINT4, 21),
        (4, True, TensorProto.INT4, 21),
        (8, False, TensorProto.UINT8, 18),
        (8, True, TensorProto.INT8, 18),
    ],
)
def test_file_stores_integer_codes_read_by_dequantize_linear(
    tmp_path, bits, symmetric, codes_type, opset
):
    quantized, path, _ = _export(tmp_path, WeightOnlySpec(bits, 32, symmetric))
    model = onnx.load(str(path))
    assert model.opset_import[0].version == opset  # blocked int4 needs opset 21
    initializers = {i.name: i for i in model.graph.initializer}
    nodes = _dequantize_nodes(model)
    head_type = TensorProto.INT8 if symmetric else TensorProto.UINT8
    types = [initializers[n.input[0]].data_type for n in nodes]
    # gate, up, down at `bits`; the head (last linear) at 8 bits
    assert types == [codes_type] * 3 + [head_type]
    floats = [tuple(i.dims) for i in initializers.values() if i.data_type == TensorProto.FLOAT]
    assert not {(128, 256), (256, 128), (128, 64)} & set(floats)  # no float weight left
    gate = next(m for m in weight_only_layers(quantized) if m.codes.shape == (256, 128))
    stored = numpy_helper.to_array(initializers[nodes[0].input[0]]).astype(np.int64)
    np.testing.assert_array_equal(stored, gate.codes.t().numpy().astype(np.int64))
    with torch.no_grad():
        expected = quantized(_x()).numpy()
    # the file's own numbers (DequantizeLinear, MatMul in float) are the PyTorch layer's
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = create_session(path, ["CPUExecutionProvider"], options=options)
    (out,) = session.run(None, {session.get_inputs()[0].name: _x().numpy()})
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    # MatMulNBits in int8 compute also quantizes the activations: close, not equal
    session = create_session(path, ["CPUExecutionProvider"])
    (fused,) = session.run(None, {session.get_inputs()[0].name: _x().numpy()})
    cosine = float(np.dot(fused.ravel(), expected.ravel()))
    cosine /= float(np.linalg.norm(fused) * np.linalg.norm(expected))
    assert cosine > 0.999


@pytest.mark.parametrize("bits", [4, 8])
def test_onnxruntime_runs_every_weight_as_matmulnbits_in_int8_compute(tmp_path, bits):
    _, path, _ = _export(tmp_path, WeightOnlySpec(bits, 32))
    optimised = _ort_optimised(path, tmp_path)
    nbits = [n for n in optimised.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 4, collections.Counter(n.op_type for n in optimised.graph.node)
    attrs = [{a.name: a.i for a in n.attribute} for n in nbits]
    assert sorted(a["bits"] for a in attrs) == ([4, 4, 4, 8] if bits == 4 else [8] * 4)
    assert {a["accuracy_level"] for a in attrs} == {4}  # int8 compute, not dequantise to fp32
    assert not _dequantize_nodes(optimised)


def test_a_2d_linear_with_bias_and_relu_is_matmulnbits_not_a_dequantising_gemm(tmp_path):
    """ONNX Runtime's MatMulAddFusion would make DequantizeLinear -> MatMul -> Add(bias) on 2-d
    activations a Gemm before MatMulNBits can form: the session disables it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 64)).eval()
    x = torch.randn(3, 128)
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    gm = apply_transformation_plan(plan_transformation(model, patterns, args=(x,))).model
    quantized, _ = weight_only_graph(gm, [x], WeightOnlySpec(8))
    path = export_onnx(quantized, [x], tmp_path / "mlp2d.onnx")
    ops = collections.Counter(n.op_type for n in _ort_optimised(path, tmp_path).graph.node)
    assert ops["MatMulNBits"] == 2 and not ops["Gemm"] + ops["FusedGemm"], ops


@pytest.mark.parametrize("symmetric", [False, True])
def test_an_odd_count_of_int4_values_packs_and_runs_as_the_layer(tmp_path, symmetric):
    """33 outputs of one 32-wide group: 33 zero points, an odd count, so the last byte holds
    one value; the codes and zero points read back from the file are the layer's own."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 33)).eval(), torch.randn(2, 32)
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    gm = apply_transformation_plan(plan_transformation(model, patterns, args=(x,))).model
    spec = WeightOnlySpec(4, 32, symmetric)
    quantized, _ = weight_only_graph(gm, [x], spec, accuracy_budget=0.0)  # the head in int4
    path = export_onnx(quantized, [x], tmp_path / "odd.onnx")
    (layer,) = weight_only_layers(quantized)
    model_proto = onnx.load(str(path))
    initializers = {i.name: i for i in model_proto.graph.initializer}
    (node,) = _dequantize_nodes(model_proto)
    stored = [numpy_helper.to_array(initializers[name]) for name in node.input]
    np.testing.assert_array_equal(stored[0].astype(np.int64), layer.codes.t().numpy())
    if not symmetric:
        assert stored[2].size == 33
        np.testing.assert_array_equal(stored[2], layer.zero_point.t().numpy())
    with torch.no_grad():
        expected = quantized(x).numpy()
    options = ort.SessionOptions()  # the file's own numbers: no int8-compute MatMulNBits
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = create_session(path, ["CPUExecutionProvider"], options=options)
    (out,) = session.run(None, {"input_0": x.numpy()})
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("bits", "symmetric", "types"),
    [
        (4, False, ["u4", "u4", "u4", "u8"]),
        (4, True, ["i4", "i4", "i4", "i8"]),
        (8, False, ["u8"] * 4),
    ],
)
def test_openvino_runs_every_weight_as_a_compressed_fully_connected(
    tmp_path, bits, symmetric, types
):
    ov = pytest.importorskip("openvino")
    _, path, _ = _export(tmp_path, WeightOnlySpec(bits, 32, symmetric))
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": 1})
    layers = [op.get_rt_info() for op in compiled.get_runtime_model().get_ops()]
    precisions = sorted(
        info["runtimePrecision"].astype(str)
        for info in layers
        if info["layerType"].astype(str) == "FullyConnected"
    )
    assert precisions == sorted(types)


def test_the_openvino_runtime_reports_int4_and_int8_layers_apart(tmp_path):
    pytest.importorskip("openvino")
    from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
    from embedl_dynamo.settings import Settings

    quantized, _, _ = _export(tmp_path, WeightOnlySpec(4, 32))
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path / "cache", num_threads=1))
    runtime.build(quantized, [_x()])
    # gate, up and down in int4; the head (the last linear) keeps 8 bits
    assert runtime.build_info["int4_layers"] == {"FullyConnected": 3}
    assert runtime.build_info["int8_layers"] == {"FullyConnected": 1}
    assert sorted(runtime.module_precisions().values()).count("int4") == 3


def test_tensorrt_lint_accepts_the_symmetric_int4_file_and_names_uint4(tmp_path):
    _, path, _ = _export(tmp_path, WeightOnlySpec(4, 32, symmetric=True), backend="tensorrt")
    assert lint_for_tensorrt(onnx.load(str(path))) == []
    (tmp_path / "asym").mkdir()
    _, asym, _ = _export(tmp_path / "asym", WeightOnlySpec(4, 32, symmetric=False))
    problems = lint_for_tensorrt(onnx.load(str(asym)))
    assert any("uint4 weights" in p for p in problems), problems


def test_a_matmul_constant_of_no_weight_only_layer_stays_float(tmp_path):
    """No match: the float graph's constants are not any layer's dequantised weight."""
    torch.manual_seed(0)
    model = Mlp().eval()
    path = export_onnx(model, [_x()], tmp_path / "float.onnx")
    float_model = onnx.load(str(path))
    quantized, _, _ = _export(tmp_path, WeightOnlySpec(8, 32))
    before = float_model.SerializeToString()
    assert store_weight_only(float_model, weight_only_layers(quantized)) == 0
    assert float_model.SerializeToString() == before
    assert not _dequantize_nodes(float_model)


def test_the_torch_export_exporter_file_holds_the_same_integer_weights(tmp_path):
    """The fallback exporter writes the file itself; it is read back and stored the same way."""
    quantized, path, _ = _export(tmp_path, WeightOnlySpec(4, 32))
    other = export_onnx(quantized, [_x()], tmp_path / "dynamo.onnx", exporter="dynamo")
    first, second = onnx.load(str(path)), onnx.load(str(other))
    assert second.opset_import[0].version == 21
    types = [
        {i.name: i.data_type for i in m.graph.initializer}[n.input[0]]
        for m in (first, second)
        for n in _dequantize_nodes(m)
    ]
    one_file = [TensorProto.UINT4] * 3 + [TensorProto.UINT8]  # the head at 8 bits
    assert types == one_file * 2


def test_a_compiled_graph_runs_its_large_integer_weights_from_memory(tmp_path):
    """Regression: a compile runs the just-exported graph from memory while its file is
    written; integer codes over ``SHARED_MIN_BYTES`` were handed to ONNX Runtime by reference,
    its DequantizeLinear -> MatMulNBits fusion then read them from an empty file, and the
    weight-only artifact was rejected for the float one."""
    import embedl_dynamo
    from embedl_dynamo.onnx.initializers import SHARED_MIN_BYTES

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1536), nn.ReLU(), nn.Linear(1536, 64)).eval()
    assert 1536 * 1024 > SHARED_MIN_BYTES  # the first layer's uint8 codes
    x = torch.randn(2, 1024)
    options = {"precision": "int8_weight_only", "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)
    with torch.no_grad():
        out, expected = compiled(x), model(x)
    (subgraph,) = embedl_dynamo.last_report().subgraphs
    assert subgraph.runtime == "onnxruntime" and "rejected" not in subgraph.reason, subgraph.reason
    assert subgraph.pipeline["precision"] == "int8_weight_only"
    cosine = F.cosine_similarity(out.flatten(), expected.flatten(), 0).item()
    assert cosine > 0.999
    embedl_dynamo.wait_for_cache_writes()
    assert list(tmp_path.rglob("*.onnx"))  # the file was written too


@pytest.mark.parametrize("count", [16, 15])
def test_int4_values_pack_two_per_byte_the_first_in_the_low_nibble(count):
    from onnx import TensorProto

    from embedl_dynamo.onnx.weight_only import _packed_int4

    values = (np.arange(count) % 16 - 8).astype(np.int8)  # -8..7: every signed 4-bit code
    proto = _packed_int4("q", values, TensorProto.INT4)
    nibbles = [int(v) & 0x0F for v in values] + [0] * (count % 2)
    expected = bytes(lo | hi << 4 for lo, hi in zip(nibbles[::2], nibbles[1::2]))
    assert proto.raw_data == expected and list(proto.dims) == [count]
    np.testing.assert_array_equal(numpy_helper.to_array(proto), values)
