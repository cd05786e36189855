"""Triton model repositories written from exports: every ``config.pbtxt`` parses with Triton's
own ``ModelConfig`` schema (tritonclient's ``model_config_pb2``) and matches its ONNX file."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.errors import ExportArgumentError
from embedl_dynamo.onnx import external_data

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

# ONNX element type -> the Triton data type name, as Triton's model_config.proto spells it
ONNX_TO_TRITON = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}


class TwoHeads(nn.Module):
    """Two inputs of different types (int64 token ids, features), two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor, x: torch.Tensor):
        h = torch.cat([x, self.embed(ids).mean(dim=1)], dim=1)
        return self.fc(h), h.sum(dim=1, keepdim=True)


def _inputs(batch: int = 2):
    torch.manual_seed(1)
    return torch.randint(0, 50, (batch, 5)), torch.randn(batch, 8)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return TwoHeads().eval()


def _parse(model_dir):
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    return config


def _onnx_io(path):
    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}

    def spec(v):
        dims = [
            d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim
        ]
        return v.name, ONNX_TO_TRITON[v.type.tensor_type.elem_type], dims

    return (
        [spec(v) for v in model.graph.input if v.name not in weights],
        [spec(v) for v in model.graph.output],
    )


def _check_against_onnx(config, onnx_file, batching: bool) -> None:
    """Names, types and dims of the config equal the ONNX graph's (batch axis left out when
    Triton batches)."""
    inputs, outputs = _onnx_io(onnx_file)
    for declared, graph in ((config.input, inputs), (config.output, outputs)):
        assert [t.name for t in declared] == [name for name, _, _ in graph]
        assert [model_config_pb2.DataType.Name(t.data_type) for t in declared] == [
            dtype for _, dtype, _ in graph
        ]
        for t, (_, _, dims) in zip(declared, graph):
            if batching:
                assert dims[0] == -1
                dims = dims[1:]
            want = dims or [1]
            assert list(t.dims) == want
            assert t.HasField("reshape") == (not dims)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One export per target, each with a Triton repository beside it."""
    root = tmp_path_factory.mktemp("triton")
    paths = {}
    for target in ("onnxruntime", "openvino", "tensorrt"):
        path = root / f"two_heads_{target}.onnx"
        export(
            _model(),
            _inputs(),
            path,
            backend=target,
            triton_repository=root / "repo",
            options={"cache_dir": root / "cache"},
        )
        paths[target] = path
    return root / "repo", paths


@pytest.mark.parametrize(
    "target, backend, kind",
    [
        ("onnxruntime", "onnxruntime", "KIND_CPU"),
        ("openvino", "openvino", "KIND_CPU"),
        ("tensorrt", "onnxruntime", "KIND_GPU"),
    ],
)
def test_every_target_config_parses_and_matches_its_onnx_file(exports, target, backend, kind):
    repo, paths = exports
    model_dir = repo / paths[target].stem
    config = _parse(model_dir)
    assert config.name == paths[target].stem
    assert config.backend == backend
    assert config.max_batch_size == 8
    # the embedding's index flag is each request's own: Triton runs one request at a time
    assert config.output[-1].name == INDEX_FLAG_OUTPUT
    assert not config.HasField("dynamic_batching")
    _check_against_onnx(config, model_dir / "1" / "model.onnx", batching=True)
    assert (model_dir / "1" / "model.onnx").read_bytes() == paths[target].read_bytes()
    [group] = config.instance_group
    assert (group.count, model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)) == (1, kind)
    if target == "tensorrt":  # ONNX Runtime's TensorRT accelerator builds the engine in Triton
        [accelerator] = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.name == "tensorrt"
        assert accelerator.parameters["precision_mode"] == "FP32"
    if target == "openvino":
        assert config.default_model_filename == "model.onnx"


def test_the_repository_model_runs_like_the_export(exports):
    repo, paths = exports
    session = ort.InferenceSession(str(repo / paths["onnxruntime"].stem / "1" / "model.onnx"))
    args = _inputs(3)
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = session.run(None, feeds)
    with torch.no_grad():
        want = _model()(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


def test_thread_settings_per_runtime(exports, tmp_path):
    _, paths = exports
    ort_dir = write_triton_repository(paths["onnxruntime"], tmp_path, instances=2, threads=1)
    config = _parse(ort_dir)
    assert config.instance_group[0].count == 2
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    ov_dir = write_triton_repository(paths["openvino"], tmp_path, instances=2, threads=3)
    config = _parse(ov_dir)
    assert config.parameters["NUM_STREAMS"].string_value == "2"
    assert config.parameters["INFERENCE_NUM_THREADS"].string_value == "6"  # all instances


def test_static_batch_gives_full_dims_and_no_batching(tmp_path):
    path = tmp_path / "static.onnx"
    export(
        _model(),
        _inputs(),
        path,
        backend="onnxruntime",
        dynamic_batch=False,
        options={"cache_dir": tmp_path / "cache"},
    )
    config = _parse(write_triton_repository(path, tmp_path / "repo"))
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    _check_against_onnx(config, path, batching=False)
    assert list(config.input[1].dims) == [2, 8]
    with pytest.raises(ExportArgumentError, match="no dynamic batch axis"):
        write_triton_repository(path, tmp_path / "repo", max_batch_size=4)


def test_a_tensorrt_engine_becomes_model_plan(exports, tmp_path):
    """The engine is TensorRT's bytes, not ours to read: a stand-in file checks the layout."""
    _, paths = exports
    source = paths["tensorrt"]
    path = tmp_path / source.name
    path.write_bytes(source.read_bytes())
    side = (
        sidecar_path(source).read_text().replace('"engine_file": null', '"engine_file": "e.engine"')
    )
    sidecar_path(path).write_text(side)
    (tmp_path / "e.engine").write_bytes(b"engine bytes")
    model_dir = write_triton_repository(path, tmp_path / "repo", max_batch_size=16)
    config = _parse(model_dir)
    assert config.backend == "tensorrt"
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.plan"]
    assert (model_dir / "1" / "model.plan").read_bytes() == b"engine bytes"
    assert config.max_batch_size == 16
    assert (
        model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"
    )
    _check_against_onnx(config, path, batching=True)
    with pytest.raises(ExportArgumentError, match="engine's profile"):
        write_triton_repository(path, tmp_path / "repo", max_batch_size=64)


def test_external_data_travels_under_the_name_the_model_refers_to(tmp_path, monkeypatch):
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 1024)
    path = tmp_path / "big.onnx"
    export(_model(), _inputs(), path, backend="onnxruntime", options={"cache_dir": tmp_path / "c"})
    model_dir = write_triton_repository(path, tmp_path / "repo", name="big_model")
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["big.onnx.data", "model.onnx"]
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    ids, x = _inputs()
    session.run(None, {"input_0": ids.numpy(), "input_1": x.numpy()})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "a/b"}, "model name"),
        ({"backend": "tflite"}, "unknown Triton backend"),
        ({"instances": 0}, "instances=0"),
        ({"threads": -1}, "threads=-1"),
    ],
)
def test_bad_settings_are_refused_by_name(exports, tmp_path, kwargs, match):
    _, paths = exports
    with pytest.raises(ExportArgumentError, match=match):
        write_triton_repository(paths["onnxruntime"], tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())
