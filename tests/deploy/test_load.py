"""Tests for :func:`embedl_dynamo.load`: exported files back as torch-in, torch-out modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy.load import ExportedModule


class _TwoHeads(nn.Module):
    """Two inputs, two outputs: checks input order and tuple outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(5, 2)

    def forward(self, image: torch.Tensor, features: torch.Tensor):
        y = torch.relu(self.bn(self.conv(image)))
        return y.mean(dim=(2, 3)), self.fc(features)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("load")
    torch.manual_seed(0)
    model = _TwoHeads().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    args = (torch.randn(2, 3, 8, 8), torch.randn(2, 5))
    path = export(model, args, root / "two.onnx", options={"cache_dir": root / "cache"})
    return model, path


def test_load_runs_on_onnxruntime_and_matches_eager(artifact) -> None:
    model, path = artifact
    loaded = load(path)
    assert isinstance(loaded, ExportedModule) and isinstance(loaded, nn.Module)
    assert loaded.runtime == "onnxruntime"
    assert "CPUExecutionProvider" in loaded.providers
    assert not loaded.training
    image, feats = torch.randn(2, 3, 8, 8), torch.randn(2, 5)
    got = loaded(image, feats)
    assert isinstance(got, tuple) and all(isinstance(t, torch.Tensor) for t in got)
    with torch.no_grad():
        want = model(image, feats)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_load_accepts_any_batch_size(artifact, batch) -> None:
    model, path = artifact
    loaded = load(path, device="CPU", num_threads=1)
    image, feats = torch.randn(batch, 3, 8, 8), torch.randn(batch, 5)
    got = loaded(image, feats)
    with torch.no_grad():
        want = model(image, feats)
    assert got[0].shape == (batch, 4) and got[1].shape == (batch, 2)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


def test_load_reads_the_sidecar(artifact) -> None:
    _, path = artifact
    meta = load(path).metadata
    assert meta["onnx_file"] == "two.onnx"
    assert [i["name"] for i in meta["inputs"]] == ["input_0", "input_1"]
    assert meta["verification"]["passed"] is True


def test_single_output_is_a_tensor_and_non_contiguous_inputs_work(tmp_path) -> None:
    model = nn.Linear(4, 3).eval()
    path = export(
        model, torch.randn(2, 4), tmp_path / "lin.onnx", options={"cache_dir": tmp_path / "cache"}
    )
    loaded = load(path)
    x = torch.randn(4, 5).t()[:, :4]  # a non-contiguous view
    y = loaded(x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, model(x).detach(), atol=1e-5, rtol=1e-5)


def test_load_errors_name_the_problem(artifact, tmp_path) -> None:
    _, path = artifact
    with pytest.raises(FileNotFoundError, match=r"no artifact at .*embedl_dynamo.export"):
        load(tmp_path / "nothing.onnx")
    other = tmp_path / "model.pt"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"expected .onnx or a TensorRT engine"):
        load(other)
    with pytest.raises(ValueError, match=r"invalid device='TPU'; valid values: auto, CPU, CUDA"):
        load(path, device="TPU")
    loaded = load(path)
    with pytest.raises(ValueError, match=r"takes 2 inputs \['input_0', 'input_1'\], got 1"):
        loaded(torch.randn(1, 3, 8, 8))
    with pytest.raises(TypeError, match=r"input 1 is a list; pass torch tensors"):
        loaded(torch.randn(1, 3, 8, 8), [1.0] * 5)


def test_engine_file_without_tensorrt_is_a_clear_error(tmp_path) -> None:
    from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

    if TensorRTRuntime.missing() is None:
        pytest.skip("TensorRT is installed: the error path does not apply")
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not an engine")
    with pytest.raises(RuntimeError, match=r"TensorRT engine, which needs TensorRT .*\.onnx file"):
        load(engine)


def test_a_file_changed_after_export_is_refused_unless_asked(tmp_path) -> None:
    import onnx
    from onnx import numpy_helper

    model = nn.Sequential(nn.Linear(4, 3)).eval()
    path = export(model, torch.randn(2, 4), tmp_path / "m.onnx")
    proto = onnx.load(str(path))
    weight = proto.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 2, weight.name))
    onnx.save(proto, str(path))  # tampered weights, sidecar untouched
    with pytest.raises(ValueError, match=r"m.onnx does not match the sha256 .*check_sha256=False"):
        load(path)
    assert load(path, check_sha256=False)(torch.randn(1, 4)).shape == (1, 3)


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"', "3"])
def test_a_sidecar_that_is_not_an_object_is_ignored_with_a_warning(
    artifact, tmp_path, caplog, content
) -> None:
    """Regression (issue 23 item 19): valid JSON that is not an object crashed load() with
    AttributeError."""
    import shutil

    model, path = artifact
    copy = shutil.copy(path, tmp_path / "copy.onnx")
    (tmp_path / "copy.json").write_text(content)
    loaded = load(copy)
    assert loaded.metadata == {}
    assert "not the object export writes" in caplog.text
    image, feats = torch.randn(2, 3, 8, 8), torch.randn(2, 5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(image, feats)[1], model(image, feats)[1])
