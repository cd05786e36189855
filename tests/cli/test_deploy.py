"""``embedl-dynamo deploy``: builds a cache once; ``--check`` starts a replica from it read-only."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo.cli.main import main

NET = """
import torch
from torch import nn

def build():
    torch.manual_seed(0 if {seeded} else torch.seed())
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
"""


@pytest.mark.parametrize(
    "seeded",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["same weights", "new weights each time"],
)
def test_deploy_builds_a_cache_a_replica_starts_from(tmp_path, capfd, seeded):
    net = tmp_path / "net.py"
    net.write_text(NET.format(seeded=seeded))
    cache = tmp_path / "cache"
    argv = [
        "deploy",
        f"{net}:build",
        "--input-shape",
        "1,3,8,8",
        "--backend",
        "onnxruntime",
        "--cache-dir",
        str(cache),
        "--batch-sizes",
        "1,3",
        "--check",
    ]
    code = main(argv)
    out = capfd.readouterr()
    assert "cache ready in" in out.out and "built" in out.out
    if seeded:
        assert code == 0, out.err
        assert "replica check: 2 subgraph(s) loaded, nothing built or written" in out.out
    else:  # the replica's weights differ from the build's: it must not pass as loaded
        assert code == 4
        assert "the cache lacks them" in out.err and "seeded" in out.err


def test_deploy_refuses_bad_batch_sizes(tmp_path, capfd):
    net = tmp_path / "net.py"
    net.write_text(NET.format(seeded=True))
    code = main(["deploy", f"{net}:build", "--input-shape", "1,3,8,8", "--batch-sizes", "1,x"])
    assert code == 2 and "invalid --batch-sizes" in capfd.readouterr().err


TOKENS = """
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 8), nn.Flatten(), nn.Linear(8 * 4, 2))
"""


def _net(tmp_path, source=None):
    source = NET.format(seeded=True) if source is None else source
    net = tmp_path / "net.py"
    net.write_text(source)
    return net


def _error(capfd) -> str:
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err, err
    return err


def test_deploy_honours_input_dtype_as_export_does(tmp_path, capfd):
    """Regression (issue 51 item 3): a token-id model failed with "internal error", and a float
    model given --input-dtype int64 built a float32 cache."""
    import onnx

    cache = tmp_path / "cache"
    argv = [
        "deploy",
        f"{_net(tmp_path, TOKENS)}:build",
        "--input-shape",
        "2,4",
        "--input-dtype",
        "int64",
        "--backend",
        "onnxruntime",
        "--cache-dir",
        str(cache),
    ]
    assert main(argv) == 0, capfd.readouterr().err
    (artifact,) = (cache / "onnx").glob("*/*.onnx")
    (given,) = onnx.load(str(artifact)).graph.input
    assert given.type.tensor_type.elem_type == onnx.TensorProto.INT64
    floats = [
        "deploy",
        f"{_net(tmp_path)}:build",
        "--input-shape",
        "1,3,8,8",
        "--input-dtype",
        "int64",
        "--cache-dir",
        str(tmp_path / "c2"),
    ]
    assert main(floats) == 2
    assert "(1, 3, 8, 8) int64" in _error(capfd) and not (tmp_path / "c2").exists()


@pytest.mark.parametrize(
    ("shapes", "text"),
    [(["1,3,9"], "(1, 3, 9) float32"), (["1,3,8,8", "1,3,8,8"], "(1, 3, 8, 8) float32, (1, 3")],
    ids=["wrong", "extra"],
)
def test_deploy_names_a_wrong_or_extra_input_shape(tmp_path, capfd, shapes, text):
    """Regression (issue 51 item 6): exit 1, "internal error"."""
    argv = ["deploy", f"{_net(tmp_path)}:build", "--cache-dir", str(tmp_path / "c")]
    for shape in shapes:
        argv += ["--input-shape", shape]
    assert main(argv) == 2
    error = _error(capfd)
    assert "fails in PyTorch itself on random inputs" in error and text in error


def test_deploy_refuses_nan_calibration_data_with_its_cause(tmp_path, capfd, monkeypatch):
    """Regression (issue 51 item 6): exit 1, "internal error", and an empty cause."""
    import numpy as np

    from embedl_dynamo.cli import deploy_command

    calib = tmp_path / "calib.npy"
    np.save(calib, np.full((4, 3, 8, 8), np.nan, dtype=np.float32))
    argv = [
        "deploy",
        f"{_net(tmp_path)}:build",
        "--input-shape",
        "2,3,8,8",
        "--precision",
        "int8",
        "--calibration",
        str(calib),
        "--backend",
        "onnxruntime",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main(argv) == 2
    assert "'calib.npy': calibration input 0 of batch 0 holds non-finite" in _error(capfd)
    # the same error raised inside torch.compile (past the file's check) keeps its cause
    monkeypatch.setattr(
        deploy_command,
        "calibration_batches",
        lambda path, inputs: [(torch.full((2, 3, 8, 8), float("nan")),)],
    )
    assert main(argv) == 2
    assert "calibration input 0 of batch 0 holds non-finite" in _error(capfd)


def test_deploy_to_a_read_only_cache_exits_3_before_any_work(tmp_path, capfd, monkeypatch):
    """Regression (issue 51 item 6): it said "cache ready" and --check exited 4, blaming the
    weights."""
    from embedl_dynamo.cli import deploy_command

    def no_work(args):
        raise AssertionError("the model was built before the cache was checked")

    monkeypatch.setattr(deploy_command, "model_and_inputs", no_work)
    argv = ["deploy", f"{_net(tmp_path)}:build", "--input-shape", "1,3,8,8", "--check"]
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_READ_ONLY", "1")
    assert main([*argv, "--cache-dir", str(tmp_path / "c")]) == 3
    error = _error(capfd)
    assert "cannot build the cache" in error and "EMBEDL_DYNAMO_CACHE_READ_ONLY=1" in error
    monkeypatch.delenv("EMBEDL_DYNAMO_CACHE_READ_ONLY")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    assert main([*argv, "--cache-dir", str(tmp_path / "project")]) == 2
    assert "holds other files and is not an embedl_dynamo cache" in _error(capfd)
