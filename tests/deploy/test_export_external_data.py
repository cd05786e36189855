"""``export``/``load`` of models over the external-data threshold: ``model.onnx`` plus
``model.onnx.data``, written and renamed together, both covered by the sidecar's sha256.

:data:`~embedl_dynamo.onnx.external_data.EXTERNAL_DATA_BYTES` is patched down to a few KB so a
tiny model takes the path a model over protobuf's 2 GiB takes.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy import verify as verify_module
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.errors import VerificationError
from embedl_dynamo.onnx import external_data


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 4096)


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


def _files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "cache")


def _export(model: nn.Module, path, tmp_path):
    return export(model, torch.randn(2, 32), path, options={"cache_dir": tmp_path / "cache"})


def test_two_exports_in_one_directory_load_their_own_weights(tmp_path, small_threshold) -> None:
    models = {"a": _mlp(0), "b": _mlp(1)}
    for name, model in models.items():
        _export(model, tmp_path / f"{name}.onnx", tmp_path)
    assert _files(tmp_path) == [
        "a.json",
        "a.onnx",
        "a.onnx.data",
        "b.json",
        "b.onnx",
        "b.onnx.data",
    ]
    side = json.loads(sidecar_path(tmp_path / "a.onnx").read_text())
    assert side["onnx_data_file"] == "a.onnx.data" and len(side["onnx_data_sha256"]) == 64
    x = torch.randn(3, 32)
    for name, model in models.items():
        with torch.no_grad():
            torch.testing.assert_close(load(tmp_path / f"{name}.onnx")(x), model(x))


def test_a_failed_verification_leaves_the_model_and_its_data_file_untouched(
    tmp_path, small_threshold, monkeypatch
) -> None:
    path = _export(_mlp(0), tmp_path / "a.onnx", tmp_path)
    names = _files(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in names}
    real = verify_module.run_onnx
    monkeypatch.setattr(verify_module, "run_onnx", lambda p, a: [o + 1.0 for o in real(p, a)])
    with pytest.raises(VerificationError, match=r"untouched"):
        _export(_mlp(1), path, tmp_path)
    assert _files(tmp_path) == names == ["a.json", "a.onnx", "a.onnx.data"]
    assert {name: (tmp_path / name).read_bytes() for name in names} == before


def test_a_changed_data_file_is_refused_unless_asked(tmp_path, small_threshold) -> None:
    path = _export(_mlp(0), tmp_path / "a.onnx", tmp_path)
    data = tmp_path / "a.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x40  # one weight changed, the .onnx file and the sidecar untouched
    data.write_bytes(bytes(raw))
    with pytest.raises(
        ValueError, match=r"a.onnx.data does not match the sha256 .*check_sha256=False"
    ):
        load(path)
    assert load(path, check_sha256=False)(torch.randn(1, 32)).shape == (1, 8)


def test_a_smaller_model_exported_over_a_large_one_leaves_no_stale_data_file(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 4096)
    path = _export(_mlp(0), tmp_path / "a.onnx", tmp_path)
    monkeypatch.undo()
    _export(_mlp(1), path, tmp_path)
    assert _files(tmp_path) == ["a.json", "a.onnx"]
    side = json.loads(sidecar_path(path).read_text())
    assert side["onnx_data_file"] is None
    x = torch.randn(3, 32)
    with torch.no_grad():
        torch.testing.assert_close(load(path)(x), _mlp(1)(x))


def test_an_int8_export_over_the_threshold_has_its_data_file(tmp_path, small_threshold) -> None:
    """Weights folded to int8 are written through ONNX's own external-data writer."""
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 16, 3)).eval()
    g = torch.Generator().manual_seed(1)
    calibration = [torch.randn(4, 3, 16, 16, generator=g) for _ in range(4)]
    x = torch.randn(2, 3, 16, 16)
    path = export(
        model,
        x,
        tmp_path / "q.onnx",
        quantize="int8",
        calibration_data=calibration,
        options={"cache_dir": tmp_path / "cache"},
    )
    assert _files(tmp_path) == ["q.json", "q.onnx", "q.onnx.data"]
    with torch.no_grad():
        torch.testing.assert_close(load(path)(x), model(x), atol=0.1, rtol=0.1)
