"""Weights added in Python give the file the TorchScript exporter writes with them (issue 10).

Each case is exported twice: the fast way (``export_params=False``, initializers captured and
attached) and the exporter's own way (``export_params=True``, forced by capturing nothing). The
two must agree node for node and byte for byte in every initializer, including the weights the
exporter computes itself: BatchNorm folded into a conv, a folded transpose, de-duplicated
shared weights, half and integer constants, an INT8 file's int8 weights.
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo.onnx import export as onnx_export
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.onnx.exporter_hooks import SHAPE_VALUE_MAX_ELEMENTS
from embedl_dynamo.onnx.initializers import (
    attach_initializers,
    graph_weights,
    tensor_proto,
    unwritten_float_model,
)
from tests.models import ResNetLike, ViTLike, randomize_batchnorm


class _Mixed(nn.Module):
    """Parameters the exporter rewrites: BN folding, a transpose, a duplicate, odd dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.a = nn.Linear(64, 8)
        self.b = nn.Linear(64, 8)
        # equal values in two tensors: the exporter keeps one and reads it through an Identity
        self.b.weight = nn.Parameter(self.a.weight.detach().clone())
        self.w = nn.Parameter(torch.randn(8, 8))
        self.register_buffer("offset", torch.randn(8).half())
        self.register_buffer("keep", torch.tensor([True, False] * 4))
        self.register_buffer("index", torch.tensor([3, 1, 0], dtype=torch.int64))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)).flatten(1)
        z = self.a(y) + self.b(y)
        z = z @ self.w.t() + self.offset.float()  # the transpose is folded into a new weight
        z = torch.where(self.keep, z, z * self.scale)
        return z[:, self.index]


def _same(fast: onnx.ModelProto, slow: onnx.ModelProto) -> None:
    assert [n.SerializeToString() for n in fast.graph.node] == [
        n.SerializeToString() for n in slow.graph.node
    ]
    assert [i.SerializeToString() for i in fast.graph.input] == [
        i.SerializeToString() for i in slow.graph.input
    ]
    assert [o.SerializeToString() for o in fast.graph.output] == [
        o.SerializeToString() for o in slow.graph.output
    ]
    fast_weights = {i.name: numpy_helper.to_array(i) for i in fast.graph.initializer}
    slow_weights = {i.name: numpy_helper.to_array(i) for i in slow.graph.initializer}
    assert fast_weights.keys() == slow_weights.keys() and fast_weights
    for name, value in fast_weights.items():
        assert value.dtype == slow_weights[name].dtype, name
        np.testing.assert_array_equal(value, slow_weights[name], err_msg=name)


@contextlib.contextmanager
def _nothing_captured():
    yield {}


def _export_both(tmp_path, monkeypatch, export):
    calls = []
    real = onnx_export._torchscript_export

    def spy(*args, **kwargs):
        calls.append(kwargs["export_params"])
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_export, "_torchscript_export", spy)
    fast = onnx.load(str(export(tmp_path / "fast")))
    assert calls and not any(calls)  # on this torch the weights were captured every time
    calls.clear()
    monkeypatch.setattr(onnx_export, "capture_initializers", _nothing_captured)
    slow = onnx.load(str(export(tmp_path / "slow")))
    # nothing captured: every export fell back to the exporter writing the weights itself
    assert calls and calls == [False, True] * (len(calls) // 2)
    return fast, slow


def test_weights_added_in_python_equal_the_exporters(tmp_path, monkeypatch):
    model = randomize_batchnorm(_Mixed().eval())
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 4, 4)

    def export(folder):
        folder.mkdir()
        return export_onnx(gm, [x], folder / "m.onnx", exporter="torchscript")

    fast, slow = _export_both(tmp_path, monkeypatch, export)
    _same(fast, slow)
    ops = {n.op_type for n in fast.graph.node}
    assert "BatchNormalization" not in ops and "Transpose" not in ops  # folded by the exporter
    assert "Identity" in ops  # the duplicate weight
    session = ort.InferenceSession(fast.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"input_0": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_int8_and_half_files_equal_the_exporters(tmp_path, monkeypatch, precision):
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    batches = [torch.randn(2, 3, 16, 16) for _ in range(2)]

    def export(folder):
        folder.mkdir()
        options = {"cache_dir": folder / "cache"}
        extra = {"calibration_data": batches} if precision == "int8" else {}
        return embedl_dynamo.export(
            model, x, folder / "m.onnx", precision=precision, options=options, **extra
        )

    fast, slow = _export_both(tmp_path, monkeypatch, export)
    _same(fast, slow)
    types = {i.data_type for i in fast.graph.initializer if len(i.dims) >= 2}
    expected = onnx.TensorProto.INT8 if precision == "int8" else onnx.TensorProto.FLOAT16
    assert expected in types


def test_a_missing_or_unstorable_value_means_the_exporter_writes_the_weights():
    model = onnx.ModelProto()
    model.graph.input.add().name = "input_0"
    model.graph.input.add().name = "w"
    assert graph_weights(model, {}, {"input_0"}) is None
    complex_weight = {"w": torch.zeros(2, dtype=torch.complex64)}
    assert graph_weights(model, complex_weight, {"input_0"}) is None
    weights = graph_weights(model, {"w": torch.arange(3.0), "other": torch.ones(1)}, {"input_0"})
    assert list(weights) == ["w"]
    attach_initializers(model, weights)
    assert [i.name for i in model.graph.input] == ["input_0"]
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), [0, 1, 2])


def test_a_streamed_file_parses_as_one_model(tmp_path):
    """The weights follow the model as a second ``graph`` field; parsers merge the two."""
    big = torch.randn(300, 200)  # over 16 kB: multi-byte length prefixes
    weights = {"w": big, "empty": torch.zeros(0), "flag": torch.tensor(True)}
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", ["input_0", "w"], ["output_0"])],
            "g",
            [onnx.helper.make_tensor_value_info("input_0", onnx.TensorProto.FLOAT, [2, 300])]
            + [
                onnx.helper.make_tensor_value_info(n, tensor_proto(n, t).data_type, t.shape)
                for n, t in weights.items()
            ],
            [onnx.helper.make_tensor_value_info("output_0", onnx.TensorProto.FLOAT, [2, 200])],
        )
    )
    unwritten_float_model(model, weights).write(tmp_path / "m.onnx")
    back = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(back)
    assert [i.name for i in back.graph.input] == ["input_0"]
    stored = {i.name: numpy_helper.to_array(i) for i in back.graph.initializer}
    assert list(stored) == ["w", "empty", "flag"]
    np.testing.assert_array_equal(stored["w"], big.numpy())
    assert stored["empty"].shape == (0,) and stored["flag"].item() is True
    x = torch.randn(2, 300)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        session.run(None, {"input_0": x.numpy()})[0], (x @ big).numpy(), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    "tensor",
    [torch.randn(3, 2), torch.randn(4).bfloat16(), torch.tensor(7), torch.tensor([True, False])],
    ids=["float", "bfloat16", "scalar", "bool"],
)
def test_tensor_proto_round_trips(tensor):
    proto = tensor_proto("t", tensor)
    if tensor.dtype == torch.bfloat16:
        back = torch.from_numpy(numpy_helper.to_array(proto).astype(np.float32))
        assert torch.equal(back, tensor.float())
    else:
        np.testing.assert_array_equal(numpy_helper.to_array(proto), tensor.numpy())
    assert list(proto.dims) == list(tensor.shape)


class _ShapeValues(nn.Module):
    """Shapes read from values: a float scale buffer (Resize), an int shape buffer (Reshape),
    big float weights beside them, and a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("shape", torch.tensor([-1, 8, 64], dtype=torch.int64))
        self.proj = nn.Linear(64, 80)
        self.register_buffer("table", torch.randn(80, 80))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="nearest")
        y = torch.reshape(y, tuple(self.shape.tolist()))
        z = self.proj(y) @ self.table
        return z.expand(x.shape[0], 8, 80).softmax(-1)


@pytest.mark.parametrize(
    "case", ["mixed", "shape_values", pytest.param("vit", marks=pytest.mark.slow)]
)
def test_shape_inference_without_weights_infers_the_same_graph(tmp_path, monkeypatch, case):
    """Every node (whose form the exporter picks from inferred shapes), input and output type
    is the same as when the exporter's shape inference is handed all the weights."""
    if case == "vit":  # attention as the pipeline rewrites it, dynamic batch
        model, x = ViTLike().eval(), torch.randn(2, 3, 16, 16)

        def export(path):
            options = {"cache_dir": path.parent / f"{path.stem}_cache"}
            return embedl_dynamo.export(model, x, path, options=options)
    else:
        model = randomize_batchnorm({"mixed": _Mixed, "shape_values": _ShapeValues}[case]())
        gm, x = fx.symbolic_trace(model.eval()), torch.randn(2, 3, 4, 4)

        def export(path):
            return export_onnx(gm, [x], path, exporter="torchscript")

    seen: list[int] = []
    real_pass = torch._C._jit_pass_onnx_graph_shape_type_inference

    def spy(graph, params, *rest):
        seen.append(max((v.numel() for v in params.values() if v.is_floating_point()), default=0))
        return real_pass(graph, params, *rest)

    monkeypatch.setattr(torch._C, "_jit_pass_onnx_graph_shape_type_inference", spy)
    lean = onnx.load(str(export(tmp_path / "lean.onnx")))
    assert seen and max(seen) <= SHAPE_VALUE_MAX_ELEMENTS  # the pass saw no weight values
    seen.clear()
    monkeypatch.setattr(onnx_export, "shape_inference_without_weights", contextlib.nullcontext)
    full = onnx.load(str(export(tmp_path / "full.onnx")))
    assert seen and max(seen) > SHAPE_VALUE_MAX_ELEMENTS  # ...and here every weight
    _same(lean, full)


def test_an_unwritten_model_runs_from_memory_as_its_written_file_does(tmp_path):
    from embedl_dynamo.onnx.export import export_onnx_unwritten
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    gm = fx.symbolic_trace(model)
    unwritten = export_onnx_unwritten(gm, [x], tmp_path / "m.onnx")
    assert unwritten is not None and not (tmp_path / "m.onnx").exists()  # nothing written yet
    unwritten.make_contiguous()
    source = unwritten.ort_source()
    assert source is not None
    model_bytes, arrays = source
    assert not any(
        i.HasField("raw_data") for i in onnx.load_from_string(model_bytes).graph.initializer
    )
    assert len(arrays) == len(unwritten.weights)  # every weight handed over as an array
    from_memory = create_session(model_bytes, ["CPUExecutionProvider"], initializers=arrays)
    del arrays, source  # ONNX Runtime copied them while loading
    unwritten.write(tmp_path / "m.onnx")
    from_file = create_session(tmp_path / "m.onnx", ["CPUExecutionProvider"])
    feeds = {"input_0": x.numpy()}
    np.testing.assert_array_equal(from_memory.run(None, feeds)[0], from_file.run(None, feeds)[0])
    torch.testing.assert_close(
        torch.from_numpy(from_file.run(None, feeds)[0]), model(x).detach(), rtol=1e-4, atol=1e-4
    )


def test_a_model_with_quantize_nodes_or_bfloat16_weights_is_not_run_from_memory(tmp_path):
    from embedl_dynamo.onnx.initializers import UnwrittenOnnx, unwritten_float_model

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("QuantizeLinear", ["input_0", "s"], ["output_0"])],
        "g",
        [onnx.helper.make_tensor_value_info("input_0", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("output_0", onnx.TensorProto.INT8, [2])],
        [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s")],
    )
    assert unwritten_float_model(onnx.helper.make_model(graph), {}) is None  # folded when written
    half = UnwrittenOnnx(onnx.ModelProto(), {"w": torch.ones(2, dtype=torch.bfloat16)})
    assert half.ort_source() is None  # numpy has no bfloat16: the runtime waits for the file


class _Embed(nn.Module):
    """An embedding table (read by Gather in place) and a linear whose weight the exporter
    transposes (a view, read by ONNX Runtime as ``FusedMatMul(transB=1)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(1024, 512)  # 2 MiB: over SHARED_MIN_BYTES
        self.head = nn.Linear(512, 600, bias=False)

    def forward(self, ids):
        return self.head(self.table(ids))


def _embed_source(tmp_path):
    from embedl_dynamo.onnx.export import export_onnx_unwritten

    torch.manual_seed(0)
    model = _Embed().eval()
    ids = torch.randint(0, 1024, (1, 5))
    gm = fx.symbolic_trace(model)
    unwritten = export_onnx_unwritten(gm, [ids], tmp_path / "m.onnx", outputs=[model(ids)])
    assert unwritten is not None
    unwritten.make_contiguous()
    return model, ids, unwritten


def test_sessions_read_the_models_own_weights_by_reference(tmp_path):
    """Sessions of one model's graphs (prefill, decode) each copying the embedding table would
    hold it once per graph: the unchanged table is handed to ONNX Runtime by reference, and so
    is the head's weight itself, not a transposed copy."""
    from embedl_dynamo.onnx.initializers import SHARED_MIN_BYTES
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    model, ids, unwritten = _embed_source(tmp_path)
    model_bytes, arrays = unwritten.ort_source()
    assert len(arrays) == 2 and arrays.shared == set(arrays)
    (table,) = [n for n in arrays if arrays[n].shape == (1024, 512)]
    assert arrays[table].nbytes >= SHARED_MIN_BYTES
    (head,) = [n for n in arrays if n != table]
    assert arrays[head].shape == (600, 512)  # W as the model stores it, not W.t()
    assert np.shares_memory(arrays[head], model.head.weight.detach().numpy())
    sessions = [
        create_session(model_bytes, ["CPUExecutionProvider"], initializers=arrays) for _ in range(2)
    ]
    feeds = {"input_0": ids.numpy()}
    expected = model(ids).detach()
    for session in sessions:
        got = torch.from_numpy(session.run(None, feeds)[0])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    arrays[table][:] = 0  # both sessions read this very memory (the model's own weight)
    assert all(not session.run(None, feeds)[0].any() for session in sessions)
    assert not model.table.weight.detach().any()


def test_a_transposed_linear_weight_is_not_copied_and_runs_as_the_file_does(tmp_path):
    """In memory ONNX Runtime runs ``FusedMatMul(transB=1)`` on ``W``; the written file keeps
    the standard ``MatMul`` on the transposed weight. Same kernel, same packed matrix: the
    outputs are equal bit for bit."""
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    model, ids, unwritten = _embed_source(tmp_path)
    (head,) = unwritten.transposed
    assert unwritten.weights[head].data_ptr() == model.head.weight.data_ptr()  # no copy made
    assert head not in unwritten.copied
    model_bytes, arrays = unwritten.ort_source()
    in_memory = onnx.load_from_string(model_bytes)
    (fused,) = [n for n in in_memory.graph.node if n.op_type == "FusedMatMul"]
    assert fused.domain == "com.microsoft" and fused.input[1] == head
    assert {a.name: onnx.helper.get_attribute_value(a) for a in fused.attribute}["transB"] == 1
    from_memory = create_session(model_bytes, ["CPUExecutionProvider"], initializers=arrays)
    unwritten.write(tmp_path / "m.onnx")
    written = onnx.load(str(tmp_path / "m.onnx"))
    assert "FusedMatMul" not in {n.op_type for n in written.graph.node}
    (matmul,) = [n for n in written.graph.node if n.op_type == "MatMul"]
    stored = numpy_helper.to_array(next(i for i in written.graph.initializer if i.name == head))
    np.testing.assert_array_equal(stored, model.head.weight.detach().numpy().T)
    from_file = create_session(tmp_path / "m.onnx", ["CPUExecutionProvider"])
    feeds = {"input_0": ids.numpy()}
    np.testing.assert_array_equal(from_memory.run(None, feeds)[0], from_file.run(None, feeds)[0])


def _matmul_graph(readers: list[tuple[str, list[str]]], outputs=("y",)) -> onnx.ModelProto:
    """``x`` and the weight ``w`` read by nodes ``(op, inputs)``; every node writes its own
    output, and the graph outputs are ``outputs``."""
    nodes = [
        onnx.helper.make_node(op, inputs, [f"y{i}" if i else "y"])
        for i, (op, inputs) in enumerate(readers)
    ]
    info = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [info(name, onnx.TensorProto.FLOAT, None) for name in outputs],
    )
    return onnx.helper.make_model(graph)


@pytest.mark.parametrize(
    "readers, weight, outputs, reason",
    [
        ([("MatMul", ["x", "w"])], torch.randn(8, 8), ("y",), "not a view: nothing to save"),
        (
            [("MatMul", ["x", "w"])],
            torch.randn(8, 8, dtype=torch.float16).t(),
            ("y",),
            "float16: FusedMatMul's CPU kernel is float32 only",
        ),
        ([("MatMul", ["w", "x"])], torch.randn(8, 8).t(), ("y",), "the first input, not B"),
        (
            [("MatMul", ["x", "w"]), ("Add", ["x", "w"])],
            torch.randn(8, 8).t(),
            ("y", "y1"),
            "another reader needs the transposed values",
        ),
        ([("MatMul", ["x", "w"])], torch.randn(8, 8).t(), ("y", "w"), "a graph output"),
        (
            [("MatMul", ["x", "w"])],
            torch.randn(16, 8)[::2].t(),
            ("y",),
            "a strided view: W.t() is no contiguous tensor",
        ),
    ],
)
def test_a_weight_read_otherwise_stays_transposed(readers, weight, outputs, reason):
    from embedl_dynamo.onnx.transposed_weights import read_transposed, transposed_weights

    model = _matmul_graph(readers, outputs)
    assert transposed_weights(model, {"w": weight}, min_bytes=0) == {}, reason
    assert read_transposed(model, set()) == 0
    assert [n.op_type for n in model.graph.node] == [op for op, _ in readers]


def test_a_matmul_b_weight_below_the_size_floor_is_copied_and_one_over_it_is_read_transposed():
    from embedl_dynamo.onnx.transposed_weights import read_transposed, transposed_weights

    model = _matmul_graph([("MatMul", ["x", "w"])])
    weight = torch.randn(8, 8).t()
    assert transposed_weights(model, {"w": weight}, min_bytes=257) == {}  # 256 bytes
    (base,) = transposed_weights(model, {"w": weight}, min_bytes=256).values()
    assert base.is_contiguous() and base.data_ptr() == weight.data_ptr()
    assert read_transposed(model, {"w"}) == 1
    assert model.graph.node[0].op_type == "FusedMatMul"
    assert any(o.domain == "com.microsoft" for o in model.opset_import)


@pytest.mark.parametrize("weight", ["head", "table"])
def test_a_weight_modified_in_place_before_the_file_is_written_fails_the_write(tmp_path, weight):
    """The file is written from the model's memory after the compile returns: a weight written
    in place meanwhile (an optimizer step, ``add_`` under ``no_grad``) would give a file that
    does not hold the numbers its content key was computed from. Its version counter moved,
    so the write fails and the cache stores nothing."""
    model, _, unwritten = _embed_source(tmp_path)
    with torch.no_grad():
        getattr(model, weight).weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place while its ONNX file"):
        unwritten.write(tmp_path / "m.onnx")
    _, _, untouched = _embed_source(tmp_path)
    untouched.write(tmp_path / "ok.onnx")  # nothing modified: written
    assert onnx.load(str(tmp_path / "ok.onnx")).graph.initializer


def test_a_large_convolution_weight_is_copied_and_its_session_builds(tmp_path):
    """ONNX Runtime's NCHWc pass reorders a convolution's weight from the initializer's own
    file before a weight given by reference replaces it: a shared conv weight made the session
    fail (and ResNet-50 ran in PyTorch on its first compile). Conv weights are copied."""
    from embedl_dynamo.onnx.export import export_onnx_unwritten
    from embedl_dynamo.onnx.initializers import SHARED_MIN_BYTES
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU()).eval()
    assert model[0].weight.nbytes >= SHARED_MIN_BYTES
    x = torch.randn(1, 256, 8, 8)
    gm = fx.symbolic_trace(model)
    unwritten = export_onnx_unwritten(gm, [x], tmp_path / "m.onnx", outputs=[model(x)])
    unwritten.make_contiguous()
    model_bytes, arrays = unwritten.ort_source()
    session = create_session(model_bytes, ["CPUExecutionProvider"], initializers=arrays)
    got = torch.from_numpy(session.run(None, {"input_0": x.numpy()})[0])
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-4)
    assert not arrays.shared


def test_a_weight_a_constant_node_reads_is_copied_and_its_session_builds():
    """ONNX Runtime's constant folding computes a node whose inputs are all constant (BERT's
    position-embedding Gather of constant ids) from the initializer's own file before a weight
    given by reference replaces it: the session failed on the empty stand-in (and BERT ran in
    PyTorch on its first compile on embedl_onnxruntime). Such weights are copied."""
    from onnx import TensorProto, helper

    from embedl_dynamo.onnx.initializers import SHARED_MIN_BYTES, UnwrittenOnnx
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    torch.manual_seed(0)
    table, ids, x = torch.randn(512, 768), torch.arange(16), torch.randn(16, 768)
    assert table.nbytes >= SHARED_MIN_BYTES
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"]),
            helper.make_node("Add", ["x", "rows"], ["y"]),
        ],
        "constant_gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 768])],
        [numpy_helper.from_array(ids.numpy(), "ids")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    unwritten = UnwrittenOnnx(model, {"table": table})
    unwritten.make_contiguous()
    model_bytes, arrays = unwritten.ort_source()
    session = create_session(model_bytes, ["CPUExecutionProvider"], initializers=arrays)
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    torch.testing.assert_close(got, x + table[ids], rtol=1e-6, atol=1e-6)
    assert not arrays.shared
