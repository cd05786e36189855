"""``load()`` runs a file where it was meant to run: the runtime its export recorded, on the
device asked for, with the model's output structure, and only the bytes its sidecar recorded
(whatever the files are called now)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.onnx import external_data
from embedl_dynamo.runtimes.onnxruntime import session as ort_session
from embedl_dynamo.runtimes.onnxruntime.onnx_backend import providers_for
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime

needs_openvino = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason="openvino is not installed"
)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


class _Heads(nn.Module):
    """Returns a dict with a nested tuple, a list, a None, an input and a number."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        h = self.body(x) * mask
        return {"logits": h, "aux": (h.relu(), [h.sum(-1), None]), "mask": mask, "n": 2}


def _export(model: nn.Module, args, path, **kwargs):
    return export(model, args, path, options={"cache_dir": path.parent / "cache"}, **kwargs)


@pytest.fixture(scope="module")
def openvino_files(tmp_path_factory):
    """An openvino-target bf16 file and an int8 file of the same MLP."""
    if not OpenVINORuntime.is_available():
        pytest.skip("openvino is not installed")
    root = tmp_path_factory.mktemp("ov")
    model, x = _mlp(), torch.randn(4, 16)
    # verify=False: where the half-form race picks the typed bf16 graph, export's verification
    # (on ONNX Runtime, which has no bf16 Gemm kernel) cannot run it; load() runs it on OpenVINO
    files = {
        precision: _export(
            model,
            x,
            root / f"{precision}.onnx",
            backend="openvino",
            precision=precision,
            verify=precision != "bf16",
        )
        for precision in ("bf16", "int8")
    }
    return model, files


@pytest.fixture(scope="module")
def float_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("float")
    model = _mlp()
    return model, _export(model, torch.randn(4, 16), root / "model.onnx")


@needs_openvino
def test_openvino_target_files_run_on_openvino_in_their_precision(openvino_files) -> None:
    from embedl_dynamo.runtimes.openvino.compile import computes_in

    model, files = openvino_files
    x = torch.randn(3, 16)
    for precision, path in files.items():
        side = json.loads(sidecar_path(path).read_text())
        assert side["runtime"]["runtime"] == "openvino"
        loaded = load(path)
        assert loaded.runtime == "openvino" and loaded.providers == []
        info = loaded.artifact_runtime.build_info
        if precision == "bf16":  # the file's bf16 (typed, or the hint's metadata) is honoured
            assert info["inference_precision"] == ("bf16" if computes_in("bf16") else "f32")
        else:
            assert sum(info["int8_layers"].values()) >= 1
        with torch.no_grad():
            want = model(x)
        cosine = torch.nn.functional.cosine_similarity(loaded(x).flatten(), want.flatten(), dim=0)
        assert cosine > 0.99


@needs_openvino
def test_runtime_argument_overrides_the_recorded_one(openvino_files) -> None:
    model, files = openvino_files
    loaded = load(files["int8"], runtime="onnxruntime")
    assert loaded.runtime == "onnxruntime" and "CPUExecutionProvider" in loaded.providers
    assert loaded(torch.randn(2, 16)).shape == (2, 8)


def test_a_runtime_the_file_cannot_use_is_a_clear_error(float_file) -> None:
    _, path = float_file
    with pytest.raises(ValueError, match=r"runtime='tvm'.*no such runtime.*auto, onnxruntime"):
        load(path, runtime="tvm")
    with pytest.raises(ValueError, match=r"runtime='tensorrt'.*does not load .onnx files"):
        load(path, runtime="tensorrt")
    assert load(path, runtime="onnxruntime").runtime == "onnxruntime"


@needs_openvino
def test_recorded_runtime_not_installed_falls_back_with_one_warning(
    openvino_files, monkeypatch, caplog
) -> None:
    _, files = openvino_files
    monkeypatch.setattr(OpenVINORuntime, "missing", classmethod(lambda cls: "not here"))
    with caplog.at_level(logging.WARNING):
        loaded = load(files["int8"])
    assert loaded.runtime == "onnxruntime"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "exported to run on openvino" in warnings[0].getMessage()


@needs_openvino
def test_openvino_device_not_here_is_a_clear_error(openvino_files) -> None:
    import openvino as ov

    if "GPU" in ov.Core().available_devices:
        pytest.skip("OpenVINO has a GPU here")
    with pytest.raises(ValueError, match=r"OpenVINO has no device 'GPU' here .*CPU"):
        load(openvino_files[1]["int8"], device="gpu")


def test_outputs_come_back_in_the_model_structure(tmp_path) -> None:
    torch.manual_seed(0)
    model = _Heads().eval()
    args = (torch.randn(2, 6), torch.rand(2, 4))
    path = _export(model, args, tmp_path / "heads.onnx")
    loaded = load(path)
    x, mask = torch.randn(3, 6), torch.rand(3, 4)
    got = loaded(x, mask)
    with torch.no_grad():
        want = model(x, mask)
    assert isinstance(got, dict) and list(got) == ["logits", "aux", "mask", "n"]
    assert isinstance(got["aux"], tuple) and isinstance(got["aux"][1], list)
    assert got["aux"][1][1] is None and got["n"] == 2 and got["mask"] is mask
    for g, w in [
        (got["logits"], want["logits"]),
        (got["aux"][0], want["aux"][0]),
        (got["aux"][1][0], want["aux"][1][0]),
    ]:
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_structure_without_a_json_form_comes_back_flat_with_a_warning(tmp_path, caplog) -> None:
    from collections import namedtuple

    pair = namedtuple("Pair", "a b")

    class Model(nn.Module):
        def forward(self, x: torch.Tensor):
            return pair(x + 1, x * 2)

    x = torch.randn(2, 3)
    with caplog.at_level(logging.WARNING):
        path = _export(Model().eval(), x, tmp_path / "pair.onnx")
    assert "flat tuple" in caplog.text and "JSON form" in caplog.text
    got = load(path)(x)
    assert type(got) is tuple and len(got) == 2
    torch.testing.assert_close(got[1], x * 2)


def _flip_byte(file, needle: bytes | None = None) -> None:
    data = bytearray(file.read_bytes())
    at = data.find(needle) + len(needle) // 2 if needle else len(data) // 2
    data[at] ^= 0x01
    file.write_bytes(bytes(data))


def _rename_pair(path, name: str):
    moved = path.with_name(f"{name}.onnx")
    shutil.move(path, moved)
    shutil.move(sidecar_path(path), sidecar_path(moved))
    return moved


def _weight_bytes(model: nn.Module) -> bytes:
    return model[0].weight.detach().numpy().tobytes()[64:96]


def test_a_renamed_pair_is_checked_by_content(tmp_path) -> None:
    """Regression (issue 38 item 3): the sha256 was checked only where the sidecar's
    ``onnx_file`` was the file's name, so a renamed, changed file loaded silently."""
    model = _mlp()
    path = _export(model, torch.randn(4, 16), tmp_path / "model.onnx")
    moved = _rename_pair(path, "deploy")
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(load(moved)(x), model(x), atol=1e-5, rtol=1e-5)
    _flip_byte(moved, _weight_bytes(model))  # a weight changes; the file still parses
    with pytest.raises(ValueError, match=r"deploy.onnx does not match the sha256 .*deploy.json"):
        load(moved)


def test_a_changed_byte_that_breaks_the_file_is_reported_as_the_change(float_file, tmp_path):
    _, path = float_file
    copy = tmp_path / "copy.onnx"
    shutil.copy(path, copy)
    shutil.copy(sidecar_path(path), sidecar_path(copy))
    data = bytearray(copy.read_bytes())
    copy.write_bytes(bytes(data[:40]))  # truncated: no runtime can read it
    with pytest.raises(ValueError, match=r"copy.onnx does not match the sha256"):
        load(copy)


def test_a_renamed_pair_with_a_data_file_checks_the_data_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 1024)
    model = _mlp()
    path = _export(model, torch.randn(4, 16), tmp_path / "model.onnx")
    data = external_data.data_path(path)
    assert data.is_file()
    moved = _rename_pair(path, "deploy")  # the data file keeps the name the file refers to
    assert load(moved)(torch.randn(2, 16)).shape == (2, 8)
    _flip_byte(data, _weight_bytes(model))
    with pytest.raises(ValueError, match=r"model.onnx.data does not match the sha256"):
        load(moved)
    data.unlink()
    with pytest.raises(ValueError, match=r"model.onnx.data is missing"):
        load(moved)


def test_a_missing_sidecar_loads_with_one_warning(float_file, tmp_path, caplog) -> None:
    model, path = float_file
    alone = shutil.copy(path, tmp_path / "alone.onnx")
    with caplog.at_level(logging.WARNING):
        loaded = load(alone)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no sidecar alone.json" in warnings[0] and "not verified" in warnings[0]
    assert loaded.runtime == "onnxruntime" and loaded.metadata == {}


def test_a_sidecar_of_another_tool_is_ignored_with_a_warning(float_file, tmp_path, caplog):
    _, path = float_file
    copy = shutil.copy(path, tmp_path / "other.onnx")
    (tmp_path / "other.json").write_text('{"name": "a config of another tool"}')
    with caplog.at_level(logging.WARNING):
        loaded = load(copy)
    assert "not an embedl_dynamo export sidecar" in caplog.text and loaded.metadata == {}


def test_an_engine_is_checked_against_its_recorded_sha256_first(float_file, tmp_path) -> None:
    _, path = float_file
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"an engine")
    side = json.loads(sidecar_path(path).read_text())
    side["engine_sha256"] = "0" * 64
    (tmp_path / "model.json").write_text(json.dumps(side))
    with pytest.raises(ValueError, match=r"model.engine does not match the sha256"):
        load(engine)


@pytest.mark.filterwarnings("ignore:Specified provider .CUDAExecutionProvider.")
def test_cuda_device_index_reaches_the_provider_options(float_file, monkeypatch) -> None:
    """Regression (issue 38 item 3): ``device="cuda:1"`` built providers without a device
    index, so ONNX Runtime ran on GPU 0."""
    gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort_session, "ort_providers", lambda: gpu)
    assert providers_for("CUDA:1") == [
        ("CUDAExecutionProvider", {"device_id": 1}),
        "CPUExecutionProvider",
    ]
    assert providers_for("CUDA") == gpu
    _, path = float_file
    loaded = load(path, device="cuda:1")  # no GPU here: ONNX Runtime falls back to its CPU
    chosen = loaded.artifact_runtime.build_info["providers"]
    assert chosen[0] == ("CUDAExecutionProvider", {"device_id": 1})
    assert loaded.artifact_runtime.to_dict()["options"] == {"device": "cuda:1"}
    with pytest.raises(ValueError, match=r"invalid device='cuda:x'; valid values"):
        load(path, device="cuda:x")


def test_a_loaded_runtime_state_round_trips_through_json(float_file) -> None:
    model, path = float_file
    runtime = load(path, device="CPU", num_threads=1).artifact_runtime
    state = runtime.to_dict()
    assert state["runtime"] == "onnxruntime" and state["num_threads"] == 1
    assert state["artifacts"] == {"model": path}
    text = json.dumps({**state, "artifacts": {"model": str(path)}})
    again = OnnxRuntime.from_dict(json.loads(text))
    x = torch.randn(2, 16)
    torch.testing.assert_close(again.infer(x)[0], runtime.infer(x)[0])
    with pytest.raises(ValueError, match=r"not a 'openvino' state with an artifact"):
        OpenVINORuntime.from_dict(state)


def test_runtime_options_the_runtime_does_not_take_are_a_clear_error(float_file, tmp_path):
    _, path = float_file
    copy = shutil.copy(path, tmp_path / "opts.onnx")
    side = json.loads(sidecar_path(path).read_text())
    side["runtime"] = {**side["runtime"], "options": {"turbo": True}}
    (tmp_path / "opts.json").write_text(json.dumps(side))
    with pytest.raises(ValueError, match=r"opts.json records runtime options \['device', 'turbo'"):
        load(copy)
