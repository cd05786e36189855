"""A re-export into a Triton repository is a new version, the one Triton serves (issue 51 item 9:
it wrote version 1 again, and Triton kept serving an existing version 2)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.deploy.triton import latest_version, write_triton_repository

pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _export(tmp_path, seed: int, name: str):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    path = tmp_path / f"{name}.onnx"
    options = {"cache_dir": tmp_path / "cache"}
    export(model, torch.randn(2, 4), path, backend="onnxruntime", options=options, progress=False)
    return path


def test_a_re_export_is_the_newest_version_and_the_old_ones_stay(tmp_path):
    repo = tmp_path / "repo"
    old, new = _export(tmp_path, 0, "old"), _export(tmp_path, 1, "new")
    model_dir = write_triton_repository(old, repo, name="m")
    assert latest_version(model_dir) == 1
    (model_dir / "2").mkdir()  # an older export left a version 2 (what Triton serves)
    (model_dir / "2" / "model.onnx").write_bytes(old.read_bytes())
    old_mask = os.umask(0o022)
    try:
        write_triton_repository(new, repo, name="m")
    finally:
        os.umask(old_mask)
    assert latest_version(model_dir) == 3  # Triton's default policy serves the highest
    assert (model_dir / "3" / "model.onnx").read_bytes() == new.read_bytes()
    assert (model_dir / "1" / "model.onnx").read_bytes() == old.read_bytes()  # to roll back to
    assert oct((model_dir / "3").stat().st_mode & 0o777) == oct(0o755)
    assert sorted(p.name for p in model_dir.iterdir()) == ["1", "2", "3", "config.pbtxt"]


def test_the_same_bytes_again_keep_the_newest_version(tmp_path):
    path = _export(tmp_path, 0, "m")
    model_dir = write_triton_repository(path, tmp_path / "repo")
    write_triton_repository(path, tmp_path / "repo")
    assert sorted(p.name for p in model_dir.iterdir()) == ["1", "config.pbtxt"]
    assert latest_version(tmp_path / "nowhere") is None
    for name in ("0", "007", "v2"):  # not versions to Triton
        (model_dir / name).mkdir()
    assert latest_version(model_dir) == 1
