"""``export()`` reads the conformance table (issue 50, item 4 of section 2): an op the file's
runtime keeps in PyTorch is refused by name, with the runtime, the reason and where it is exact;
NaN and infinities are guarded per runtime as the sidecar records; an index PyTorch refuses sets
the file's named flag output, and ``load()`` raises ``IndexError`` on it."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from google.protobuf import text_format
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy import export_guards
from embedl_dynamo.deploy.export_guards import check_export_graph, export_blockers
from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT
from embedl_dynamo.deploy.non_finite import non_finite_risk
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.deploy.sidecar_fields import check_fields
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.errors import ExportError
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.runtimes.conformance import Difference, judge


class MaskPositions(nn.Module):
    """The issue's case: an int32 mask's running count, scaled."""

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.cumsum(1) * 1e6


class Steps(nn.Module):
    """One integer op both runtimes compute (OpenVINO's int add is kept: it wraps in int32)."""

    def forward(self, step: torch.Tensor) -> torch.Tensor:
        return torch.bitwise_and(step, 7)


class Tokens(nn.Module):
    """Token ids through an embedding table."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def _options(tmp_path) -> dict:
    return {"cache_dir": tmp_path / "cache"}


def _export(model: nn.Module, x: torch.Tensor, path, backend: str):
    options = _options(path.parent)
    return export(model, x, path, backend=backend, progress=False, options=options)


def test_an_op_kept_on_openvino_is_refused_naming_op_runtime_reason_and_where_it_is_exact(
    tmp_path,
) -> None:
    mask = torch.ones(2, 3000, dtype=torch.int32)
    path = tmp_path / "positions.onnx"
    with pytest.raises(ExportError) as refused:
        export(
            MaskPositions().eval(),
            mask,
            path,
            backend="openvino",
            progress=False,
            options=_options(tmp_path),
        )
    message = str(refused.value)
    assert "cumsum" in message and "on openvino" in message  # the op and the runtime
    assert "int64 running sums computed as int32 wrap" in message  # the table's reason
    assert "backend='onnxruntime'" in message  # where the table says it is exact
    assert not path.exists() and not sidecar_path(path).exists()


def test_the_same_op_exports_on_onnxruntime_and_answers_as_pytorch(tmp_path) -> None:
    mask = torch.ones(2, 3000, dtype=torch.int32)
    model = MaskPositions().eval()
    path = _export(model, mask, tmp_path / "positions.onnx", "onnxruntime")
    module = load(path)
    longer = torch.ones(1, 3000, dtype=torch.int32)
    torch.testing.assert_close(module(longer), model(longer), rtol=0, atol=0)
    assert module(longer)[0, -1].item() == 3e9  # 3000 * 1e6: the running count did not wrap
    guards = json.loads(sidecar_path(path).read_text())["guards"]
    assert guards["index_out_of_range"] is None
    assert not module.index_flag


class Windows(nn.Module):
    """Swin's window split: a size computed from the batch (``9 * batch``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] * 9, 4).relu()


def test_a_size_computed_from_the_batch_suggests_a_file_of_static_sizes(tmp_path) -> None:
    """OpenVINO computes the size arithmetic of a dynamic batch as int32, which the guard
    cannot bound here; a static file holds the size as a constant and exports."""
    model, x = Windows().eval(), torch.randn(2, 36)
    with pytest.raises(ExportError, match="export static sizes .dynamic_batch=False") as refused:
        export(model, x, tmp_path / "w.onnx", backend="openvino", progress=False)
    assert "mul" in str(refused.value) and "backend='onnxruntime'" in str(refused.value)
    path = export(
        model, x, tmp_path / "w.onnx", backend="openvino", progress=False, dynamic_batch=False
    )
    torch.testing.assert_close(load(path)(x), model(x), rtol=0, atol=0)


def test_a_refusal_of_tensor_ops_does_not_suggest_static_sizes(tmp_path) -> None:
    mask = torch.ones(2, 3000, dtype=torch.int32)
    with pytest.raises(ExportError) as refused:
        export(MaskPositions().eval(), mask, tmp_path / "p.onnx", backend="openvino")
    assert "static sizes" not in str(refused.value)


def test_no_runtime_computing_the_op_says_so(monkeypatch) -> None:
    """A node both CPU runtimes keep: the message names none as exact."""
    gm = capture(nn.ReLU().eval(), (torch.randn(2, 3),))

    def keep_relu(node, runtime):
        return f"relu stays in PyTorch on {runtime}: a test" if "relu" in node.name else None

    monkeypatch.setattr(export_guards, "node_blocker", keep_relu)
    with pytest.raises(ExportError, match=r"relu.*on onnxruntime: a test.*no CPU runtime"):
        check_export_graph(gm, "onnxruntime", "onnxruntime")
    assert check_export_graph(gm, "tensorrt", "onnxruntime").graph is gm  # its lint judges it


def test_a_listed_difference_on_finite_values_is_refused(monkeypatch) -> None:
    """Only NaN and infinities may be guarded per call; an integer edge no guard sees coming
    (uint8 saturating where PyTorch wraps) is refused as a kept op is."""
    gm = capture(Steps().eval(), (torch.arange(6, dtype=torch.int32),))
    assert export_blockers(gm, "openvino") == []
    saturates = Difference("openvino", "255", "uint8 sums saturate at 255")
    monkeypatch.setattr(judge, "differences", lambda op, runtime: (saturates,))
    ((node, reason),) = export_blockers(gm, "openvino")
    assert "bitwise_and on torch.int32" in reason and "saturate at 255" in reason
    with pytest.raises(ExportError, match="saturate at 255"):
        check_export_graph(gm, "openvino", "openvino")


def test_nan_guards_follow_the_table_per_runtime_and_load_reads_them(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    guards = check_export_graph(capture(model, (torch.randn(2, 4),)), "openvino", "openvino")
    reasons = guards.non_finite
    assert reasons["onnxruntime"] is None  # ReLU keeps NaN on ONNX Runtime
    assert "OpenVINO computes relu" in reasons["openvino"]  # OV_CLAMP: NaN gives 0
    sidecar = {"guards": guards.to_dict()}
    check_fields(sidecar, "model.json")
    assert non_finite_risk("onnxruntime", sidecar) is None
    risk = non_finite_risk("openvino", sidecar)
    assert risk is not None and "runtime='onnxruntime'" in risk.fix
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    both = check_export_graph(capture(conv, (x,)), "tensorrt", "onnxruntime")
    risk = non_finite_risk("onnxruntime", {"guards": both.to_dict()})  # conv differs on both
    assert risk is not None and "convolution" in risk.reason and "runtime=" not in risk.fix


def test_an_edited_guards_field_is_refused() -> None:
    bad = {"guards": {"index_out_of_range": {"output": INDEX_FLAG_OUTPUT, "ops": "embedding"}}}
    with pytest.raises(ValueError, match="'guards'.*index_out_of_range"):
        check_fields(bad, "model.json")
    with pytest.raises(ValueError, match="'guards'.*non_finite_inputs"):
        check_fields({"guards": {"non_finite_inputs": {"openvino": 1}}}, "model.json")


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_an_index_pytorch_refuses_raises_index_error_from_the_loaded_file(
    backend, tmp_path
) -> None:
    if backend == "openvino":
        pytest.importorskip("openvino")
    torch.manual_seed(0)
    model = Tokens().eval()
    ids = torch.randint(0, 10, (2, 5))
    path = _export(model, ids, tmp_path / "tokens.onnx", backend)
    outputs = onnx.load(str(path)).graph.output
    assert outputs[-1].name == INDEX_FLAG_OUTPUT
    side = json.loads(sidecar_path(path).read_text())
    assert side["outputs"][-1] == {"name": INDEX_FLAG_OUTPUT, "shape": ["batch"], "dtype": "bool"}
    assert side["guards"]["index_out_of_range"]["ops"] == ["embedding@embed"]
    module = load(path)
    assert module.runtime == backend and module.index_flag
    valid = torch.randint(0, 10, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(module(valid), model(valid))  # one tensor, as before
    for bad in (-1, 10):
        ids = valid.clone()
        ids[1, 2] = bad
        with pytest.raises(IndexError):
            model(ids)  # PyTorch refuses it
        if backend == "onnxruntime" and bad == 10:
            with pytest.raises(Exception, match="out of data bounds"):  # ORT's own refusal
                module(ids)
            continue
        with pytest.raises(IndexError, match=r"tokens.onnx: an index .* embedding@embed"):
            module(ids)
    flat = module.run_flat(valid)  # a server's view: the flag is the file's last output
    assert len(flat) == 2 and flat[-1].dtype == torch.bool and not flat[-1].any()


def test_a_triton_repository_exposes_the_flag_and_its_config_says_so(tmp_path) -> None:
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (2, 5))
    path = _export(Tokens().eval(), ids, tmp_path / "tokens.onnx", "onnxruntime")
    model_dir = write_triton_repository(path, tmp_path / "triton")
    text = (model_dir / "config.pbtxt").read_text()
    config = text_format.Parse(text, pb2.ModelConfig())
    flag = config.output[-1]
    assert flag.name == INDEX_FLAG_OUTPUT and flag.data_type == pb2.TYPE_BOOL
    assert config.max_batch_size > 0 and not config.HasField("dynamic_batching")
    assert f"# output {INDEX_FLAG_OUTPUT} is True" in text and "embedding@embed" in text
    plain = _export(nn.Linear(4, 3).eval(), torch.randn(2, 4), tmp_path / "plain.onnx", "openvino")
    text = (write_triton_repository(plain, tmp_path / "triton") / "config.pbtxt").read_text()
    config = text_format.Parse(text, pb2.ModelConfig())  # no flag: Triton batches requests
    assert config.HasField("dynamic_batching") and not text.startswith("#")
