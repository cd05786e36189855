"""Warm starts across processes: a second process on the same cache builds nothing for any
precision, and a read-only copy of the cache in another directory starts the same and writes
nothing there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.cache.files import ENV_CACHE_READ_ONLY, read_only_reason
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.errors import ReadOnlyCacheError
from tests.models import TinyConvNet

ROOT = Path(__file__).resolve().parents[2]


def _run_worker(cache: Path, read_only: bool = False) -> dict:
    env = {**os.environ, "EMBEDL_DYNAMO_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    env.pop(ENV_CACHE_READ_ONLY, None)
    if read_only:
        env[ENV_CACHE_READ_ONLY] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tests.dynamo.warm_start_worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its size and modification time (ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("warm") / "cache"
    return cache, _run_worker(cache)


@pytest.mark.slow  # two fresh processes, four precisions each: about 25 s. By default a fresh
# process starts from a cache in tests/cli/test_deploy.py (deploy --check's replica) and from a
# saved INT8 function in tests/test_examples.py (save_and_load); warm starts of each precision
# in one process: tests/tuning (test_mixed_precision, test_half_form, test_beat_eager)
def test_a_second_process_loads_every_precision_and_builds_nothing(built):
    cache, first = built
    assert all(not r["loaded"][0] for r in first.values())  # the first process built them
    before = _tree(cache / "onnx")
    second = _run_worker(cache)
    for precision, result in second.items():
        assert result["loaded"] and all(s.startswith("loaded") for s in result["loaded"]), (
            precision,
            result["report"],
        )
        assert all(", loaded" in line for line in result["report"])
        assert result["runtime"] == first[precision]["runtime"]
        assert result["output"] == first[precision]["output"], precision
    assert _tree(cache / "onnx").keys() == before.keys()  # no artifact exported again


@pytest.mark.slow  # a third process: about 20 s; the read-only cache in this process below
def test_a_read_only_copy_elsewhere_starts_the_same_and_writes_nothing(built, tmp_path):
    cache, first = built
    shipped = tmp_path / "moved" / "shipped_cache"  # another path: nothing keyed by location
    shutil.copytree(cache, shipped)
    before = _tree(shipped)
    third = _run_worker(shipped, read_only=True)
    for precision, result in third.items():
        assert all(s.startswith("loaded") for s in result["loaded"]), result["report"]
        assert result["output"] == first[precision]["output"], precision
    assert _tree(shipped) == before


def test_a_read_only_cache_without_the_entry_builds_and_stores_nothing(
    tmp_path, monkeypatch, caplog
):
    cache = tmp_path / "c"
    (cache / "onnx").mkdir(parents=True)
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, "1")
    before = _tree(cache)
    model, x = TinyConvNet().eval(), torch.randn(1, 3, 8, 8)
    compiled = torch.compile(model, backend="embedl_onnxruntime", options={"cache_dir": str(cache)})
    with torch.inference_mode(), caplog.at_level("WARNING", logger="embedl_dynamo"):
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert embedl_dynamo.last_report()[0].runtime == "onnxruntime"
    assert any("read-only cache" in r.getMessage() for r in caplog.records)
    assert _tree(cache) == before


def test_a_read_only_cache_refuses_writes_and_keeps_a_corrupt_entry(tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path, "onnx")
    path = cache.put("ab" * 16, b"weights", ".onnx")
    path.write_bytes(b"changed")  # corrupt, same size
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, "yes")
    shipped = ArtifactCache(tmp_path, "onnx")
    assert shipped.get("ab" * 16, ".onnx") is None  # ignored, not trusted
    assert path.read_bytes() == b"changed"  # and not removed
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        shipped.put("cd" * 16, b"x", ".onnx")


def test_read_only_reason_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_CACHE_READ_ONLY, raising=False)
    assert read_only_reason(tmp_path) is None
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, "1")
    assert ENV_CACHE_READ_ONLY in read_only_reason(tmp_path)
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, "maybe")
    with pytest.raises(ValueError, match=ENV_CACHE_READ_ONLY):
        read_only_reason(tmp_path)


def test_a_build_decided_on_another_cpu_is_used_as_built_and_says_so(tmp_path, monkeypatch):
    from embedl_dynamo.dynamo import warm_start

    model, x = TinyConvNet().eval(), torch.randn(1, 3, 8, 8)
    options = {"cache_dir": str(tmp_path)}
    monkeypatch.setattr(warm_start, "cpu_name", lambda: "Build Machine CPU")
    with torch.inference_mode():
        expected = torch.compile(model, backend="embedl_onnxruntime", options=options)(x)
    monkeypatch.setattr(warm_start, "cpu_name", lambda: "Replica CPU")
    torch._dynamo.reset()
    with torch.inference_mode():
        actual = torch.compile(model, backend="embedl_onnxruntime", options=options)(x)
    (report,) = embedl_dynamo.last_report()
    assert report.loaded == "loaded (decided on Build Machine CPU)"
    assert "decided on Build Machine CPU" in str(report)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
