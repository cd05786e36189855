"""``load()``'s integrity check covers the files the ONNX graph actually reads its weights from:
a graph re-pointed at another model's ``weights.bin`` beside it, or at a file outside its folder,
is refused even where the ``.onnx`` file's own sha256 in the sidecar was rewritten to match."""

from __future__ import annotations

import hashlib
import json
import shutil

import onnx
import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy.integrity import external_data_files, verify_artifact
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.onnx import external_data


@pytest.fixture
def two_exports(tmp_path, monkeypatch):
    """``a.onnx`` and ``b.onnx`` (same layers, other weights), each with its data file."""
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 4096)
    models = {}
    for seed, name in enumerate("ab"):
        torch.manual_seed(seed)
        models[name] = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
        options = {"cache_dir": tmp_path / "cache"}
        path = tmp_path / f"{name}.onnx"
        export(models[name], torch.randn(2, 32), path, progress=False, options=options)
    return tmp_path, models


def _repoint(path, location: str) -> None:
    """Point every external tensor of ``path`` at ``location`` and write the file's new sha256
    into its sidecar (the forgery the data-file record must still catch)."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, str(path))
    side = json.loads(sidecar_path(path).read_text())
    side["onnx_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    sidecar_path(path).write_text(json.dumps(side))


def test_the_files_the_graph_reads_are_found(two_exports):
    root, _ = two_exports
    model = onnx.load(str(root / "a.onnx"), load_external_data=False)
    assert external_data_files(model) == {"a.onnx.data"}
    verify_artifact(root / "a.onnx")  # an untouched export passes


def test_a_graph_repointed_at_another_models_weights_is_refused(two_exports):
    root, models = two_exports
    shutil.copy(root / "b.onnx.data", root / "weights.bin")
    _repoint(root / "a.onnx", "weights.bin")
    x = torch.randn(3, 32)
    with torch.no_grad():  # what the file now computes: b's weights under a's name
        torch.testing.assert_close(load(root / "a.onnx", check_sha256=False)(x), models["b"](x))
    refusal = r"a.onnx reads its weights from 'weights.bin', a file its sidecar a.json did not"
    with pytest.raises(ValueError, match=refusal):
        load(root / "a.onnx")
    with pytest.raises(ValueError, match=refusal):
        verify_artifact(root / "a.onnx")


@pytest.mark.parametrize("location", ["../a.onnx.data", "/tmp/a.onnx.data", "..\\a.onnx.data"])
def test_a_location_outside_the_models_folder_is_refused(two_exports, location):
    root, _ = two_exports
    _repoint(root / "a.onnx", location)
    with pytest.raises(ValueError, match=r"outside its own folder; refused"):
        load(root / "a.onnx")
