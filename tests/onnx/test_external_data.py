"""Models over the external-data threshold: one data file per model, named after it.

:data:`~embedl_dynamo.onnx.external_data.EXTERNAL_DATA_BYTES` is patched down to a few KB so a
tiny model takes the path a model over protobuf's 2 GiB takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from embedl_dynamo.cache.files import wait_for_cache_writes
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.onnx import external_data
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.onnx.int8_weights import store_weights_as_int8
from tests.helpers import dynamo_frozen

REPO = Path(__file__).resolve().parents[2]
SMALL = 4096  # bytes: the models below hold more weights than this


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", SMALL)


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


def _ort(path: Path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_0": x.numpy()})[0]


def test_two_models_in_one_directory_each_have_their_own_data_file(tmp_path, small_threshold):
    x = torch.randn(2, 32)
    models = {"a": _mlp(0), "b": _mlp(1)}
    for name, model in models.items():
        gm, inputs = dynamo_frozen(model, x)
        export_onnx(gm, inputs, tmp_path / f"{name}.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.onnx",
        "a.onnx.data",
        "b.onnx",
        "b.onnx.data",
    ]
    for name, model in models.items():
        path = tmp_path / f"{name}.onnx"
        proto = onnx.load(str(path), load_external_data=False)
        assert external_data.external_locations(proto) == {f"{name}.onnx.data"}
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(_ort(path, x), want, rtol=1e-5, atol=1e-6)


def test_a_model_under_the_threshold_stays_one_file(tmp_path) -> None:
    x = torch.randn(2, 32)
    gm, inputs = dynamo_frozen(_mlp(0), x)
    export_onnx(gm, inputs, tmp_path / "m.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_weights_an_exporter_wrote_per_tensor_are_gathered_into_one_data_file(
    tmp_path, small_threshold
) -> None:
    """The exporter's own writer (the fallback) names a file after each tensor."""
    x = torch.randn(2, 32)
    gm, inputs = dynamo_frozen(_mlp(0), x)
    path = export_onnx(gm, inputs, tmp_path / "m.onnx")
    proto = onnx.load(str(path))
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    (path.parent / "m.onnx.data").unlink()
    assert len(list(tmp_path.iterdir())) > 2  # a file per tensor
    store_weights_as_int8(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    with torch.no_grad():
        want = _mlp(0)(x).numpy()
    np.testing.assert_allclose(_ort(path, x), want, rtol=1e-5, atol=1e-6)


_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys, torch
    sys.path.insert(0, {repo!r})
    from torch import nn
    from embedl_dynamo.onnx import external_data
    from tests.helpers import BUILD_COUNTS, count_builds
    external_data.EXTERNAL_DATA_BYTES = {small}
    count_builds()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(2, 32)
    seen = {{}}
    for runtime in ("onnxruntime", "openvino"):
        if importlib.util.find_spec(runtime) is None:
            continue
        torch._dynamo.reset()
        before = BUILD_COUNTS.get("onnx", 0)
        with torch.no_grad():
            y = torch.compile(model, backend="embedl_onnxruntime",
                              options={{"runtime": runtime}})(x)
            err = float((y - model(x)).abs().max())
        seen[runtime] = {{"err": err, "builds": BUILD_COUNTS.get("onnx", 0) - before}}
    print(json.dumps(seen))
    """
)


def _compile_in_a_process(cache: Path) -> dict:
    """Per installed runtime (ONNX Runtime, OpenVINO): the error and the ONNX builds."""
    script = _SCRIPT.format(repo=str(REPO), small=SMALL)
    env = {**os.environ, "EMBEDL_DYNAMO_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes: about 20 s; torch.compile over the threshold in this
# process: test_a_cached_model_whose_data_file_changed_is_not_served
def test_torch_compile_over_the_threshold_runs_and_warm_starts(tmp_path) -> None:
    """Compiled for each runtime, then compiled again by a second process from the cache (its
    data file too)."""
    cache = tmp_path / "shared"
    first = _compile_in_a_process(cache)
    assert "onnxruntime" in first
    assert all(r["err"] < 1e-5 for r in first.values())
    # one ONNX file with its data file, built once: the runtimes differ after the export
    assert sum(r["builds"] for r in first.values()) == 1
    assert len(list((cache / "onnx").glob("*/*.onnx.data"))) == 1
    second = _compile_in_a_process(cache)
    assert second.keys() == first.keys()
    assert all(r["builds"] == 0 and r["err"] < 1e-5 for r in second.values())


def test_a_cached_model_whose_data_file_changed_is_not_served(tmp_path, small_threshold) -> None:
    model, x = _mlp(0), torch.randn(2, 32)
    with torch.no_grad():
        torch.compile(model, backend="embedl_onnxruntime")(x)
    wait_for_cache_writes()
    cache = ArtifactCache(os.environ["EMBEDL_DYNAMO_CACHE_DIR"], "onnx")
    (data,) = cache.dir.glob("*/*.onnx.data")
    key = data.name.split(".")[0]
    assert cache.get(key, ".onnx") is not None
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert cache.get(key, ".onnx") is None  # corrupt: removed, to be rebuilt
    assert not data.exists() and not list(cache.dir.glob("*/*.onnx"))
