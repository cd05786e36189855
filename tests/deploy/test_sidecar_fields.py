"""One reader of the export sidecar, which checks and bounds every field that is acted on
(:mod:`embedl_dynamo.deploy.sidecar_fields`): ``load()``, serving and the Triton writer refuse an
edited ``model.json`` in one line naming the field, instead of hanging on 100,000 threads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy import sidecar as sidecar_module
from embedl_dynamo.deploy.sidecar import read_sidecar, sidecar_path
from embedl_dynamo.deploy.sidecar_fields import max_threads
from embedl_dynamo.deploy.triton import write_triton_repository
from embedl_dynamo.errors import ExportArgumentError
from embedl_dynamo.serve import check_artifact


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    root = tmp_path_factory.mktemp("sidecar")
    options = {"cache_dir": root / "cache"}
    return export(model, torch.randn(2, 8), root / "m.onnx", progress=False, options=options)


@pytest.fixture
def copy(exported, tmp_path):
    """A copy of the export (file and sidecar) this test may edit."""
    path = tmp_path / "m.onnx"
    shutil.copy(exported, path)
    shutil.copy(sidecar_path(exported), sidecar_path(path))
    return path


def _edit(path, change) -> None:
    side = json.loads(sidecar_path(path).read_text())
    change(side)
    sidecar_path(path).write_text(json.dumps(side))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s["runtime"].update(num_threads=100000), r"'runtime'.*num_threads=100000"),
        (lambda s: s["runtime"].update(num_threads=max_threads() + 1), r"'runtime'.*from 1 to"),
        (lambda s: s["runtime"].update(num_threads="4"), r"'runtime'.*num_threads='4'"),
        (lambda s: s["runtime"].update(options=[1]), r"'runtime' has options"),
        (lambda s: s.update(onnx_data_file="../other.onnx.data"), r"'onnx_data_file' is not a"),
        (lambda s: s.update(engine_file="/tmp/x.engine"), r"'engine_file' is not a file name"),
        (lambda s: s.update(onnx_sha256="abc"), r"'onnx_sha256' is not a sha256"),
        (lambda s: s.update(output_tree={"spec": 1}), r"'output_tree' is not an output tree"),
        (lambda s: s["inputs"][0].update(shape=[-2, 8]), r"'inputs' \[0\] has an axis"),
        (lambda s: s["settings"].update(max_batch=0), r"'settings' has max_batch=0"),
        (lambda s: s.update(quantized="no"), r"'quantized' is not true or false"),
    ],
)
def test_an_edited_field_is_refused_by_every_reader(copy, change, match):
    _edit(copy, change)
    with pytest.raises(ValueError, match=rf"m.json: its field {match}.*export the model again"):
        load(copy)
    with pytest.raises(ValueError, match=match):  # serve checks before Ray starts
        check_artifact(copy)
    pytest.importorskip("tritonclient.grpc")
    with pytest.raises(ExportArgumentError, match=match):  # it used to read it unchecked
        write_triton_repository(copy, copy.parent / "triton")


def test_fields_only_people_read_are_not_checked_and_valid_ones_load(copy):
    def change(side):
        side.update(plan="edited", timings_s=None)
        side["runtime"]["num_threads"] = 1

    _edit(copy, change)
    module = load(copy)
    assert module.artifact_runtime.settings.num_threads == 1
    assert read_sidecar(copy)[0]["plan"] == "edited"


def test_a_huge_sidecar_is_refused_unread(copy, monkeypatch):
    monkeypatch.setattr(sidecar_module, "MAX_SIDECAR_BYTES", 100)
    with pytest.raises(ValueError, match=r"m.json holds \d+ bytes, more than the 100"):
        load(copy)
