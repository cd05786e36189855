"""OpenVINO's compiled models in the artifact cache: a second build of the same artifact
imports the compiled model instead of reading and compiling the ONNX file."""

from __future__ import annotations

import logging
import os
import stat

import pytest
import torch

from embedl_dynamo.runtimes.openvino import compile as openvino_compile
from embedl_dynamo.runtimes.openvino import compiled_cache
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import replace_cache_file
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)


@pytest.fixture
def compiles(monkeypatch):
    """Counts the ONNX files OpenVINO compiles (not imports) through the cache's path."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return openvino_compile.compile_openvino(*args, **kwargs)

    monkeypatch.setattr(compiled_cache, "compile_openvino", counted)
    return calls


def _build(cache_dir, model, x):
    runtime = OpenVINORuntime(Settings(cache_dir=cache_dir, num_threads=1))
    return runtime.build(torch.fx.symbolic_trace(model), [x])


def _blobs(root):
    return sorted((root / "openvino_compiled").rglob("*.blob"))


def test_a_second_build_imports_the_compiled_model_with_its_build_info(tmp_path, compiles):
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    first = _build(tmp_path, model, x)
    assert len(compiles) == 1 and len(_blobs(tmp_path)) == 1
    second = _build(tmp_path, model, x)
    assert len(compiles) == 1  # imported, not compiled
    assert second.build_info["openvino_compiled_model"] == "imported from the cache"
    assert second.build_info["inference_precision"] == first.build_info["inference_precision"]
    with torch.no_grad():
        assert torch.equal(second.infer(x)[0], first.infer(x)[0])


def test_other_compile_options_are_another_entry(tmp_path, compiles):
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    _build(tmp_path, model, x)
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path, num_threads=2))
    runtime.build(torch.fx.symbolic_trace(model), [x])
    assert len(compiles) == 2 and len(_blobs(tmp_path)) == 2


def test_a_corrupt_entry_is_compiled_again_and_replaced(tmp_path, compiles, caplog):
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    expected = _build(tmp_path, model, x).infer(x)[0]
    (blob,) = _blobs(tmp_path)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = _build(tmp_path, model, x)
    assert len(compiles) == 2 and "openvino_compiled_model" not in again.build_info
    assert "corrupt" in caplog.text
    assert torch.equal(again.infer(x)[0], expected)
    assert len(_blobs(tmp_path)) == 1  # stored anew


def test_a_read_only_cache_imports_and_writes_nothing(tmp_path, compiles, monkeypatch):
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    expected = _build(tmp_path, model, x).infer(x)[0]
    for blob in _blobs(tmp_path):
        blob.with_name(blob.name + ".meta.json").unlink()  # this entry is now unusable
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_READ_ONLY", "1")
    again = _build(tmp_path, model, x)
    assert len(compiles) == 2  # compiled, since the entry had no checksum
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    assert torch.equal(again.infer(x)[0], expected)


def test_a_file_from_elsewhere_is_compiled_and_not_kept(tmp_path, compiles, monkeypatch):
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    built = _build(tmp_path / "cache", model, x)
    path = tmp_path / "model.onnx"
    path.write_bytes(open(built.build_info["artifact"], "rb").read())
    os.chmod(path, stat.S_IRUSR)
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "default"))
    OpenVINORuntime.load_artifact(path, Settings(cache_dir=tmp_path / "default"))
    assert len(compiles) == 2 and not (tmp_path / "default" / "openvino_compiled").exists()


def test_an_artifact_over_the_bound_keeps_only_its_file_weights_in_a_data_file_included(
    tmp_path, compiles, monkeypatch
):
    """The bound counts the weights in the data file, not only the small graph file."""
    from embedl_dynamo.onnx import external_data

    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_BYTES", 1024)
    built = _build(tmp_path, model, x)
    onnx_file = built.build_info["artifact"]
    graph_bytes = os.path.getsize(onnx_file)
    assert os.path.exists(external_data.data_path(onnx_file))
    monkeypatch.setattr(compiled_cache, "MAX_ARTIFACT_BYTES", graph_bytes + 1)
    _build(tmp_path / "other", model, x)
    assert not _blobs(tmp_path / "other")


def test_an_artifact_replaced_by_other_bytes_is_not_imported_the_old_model(tmp_path, compiles):
    """The compiled model is keyed by the sha256 its artifact is recorded with: an artifact
    rebuilt under its key with other bytes (one found wrong, then replaced) compiles anew."""
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    key = _build(tmp_path, model, x).build_info["key"]
    other = _build(tmp_path / "other", randomize_batchnorm(ResNetLike().eval()), x)
    (artifact,) = (tmp_path / "onnx").rglob("*.onnx")
    replace_cache_file(artifact, open(other.build_info["artifact"], "rb").read())
    runtime = OpenVINORuntime(Settings(cache_dir=tmp_path, num_threads=1))
    assert runtime.use_cached(key)
    runtime.build(torch.fx.symbolic_trace(model), [x])  # a warm start's judge would refuse it
    assert len(compiles) == 3 and "openvino_compiled_model" not in runtime.build_info
    with torch.no_grad():
        assert torch.equal(runtime.infer(x)[0], other.infer(x)[0])  # the bytes it holds


def test_an_imported_model_reads_its_mapped_blob_for_as_long_as_it_lives(tmp_path, compiles):
    """OpenVINO keeps reading the blob it imported from a mapping (no copy): the compiled
    model holds the mapping, so an entry removed or replaced meanwhile does not pull the
    memory from under it."""
    import gc

    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    expected = _build(tmp_path, model, x).infer(x)[0]
    imported = _build(tmp_path, model, x)
    assert imported.build_info["openvino_compiled_model"] == "imported from the cache"
    for blob in _blobs(tmp_path):
        blob.unlink()  # as eviction or a replacement would
    gc.collect()
    with torch.no_grad():
        assert torch.equal(imported.infer(x)[0], expected)


def test_a_compiled_model_that_cannot_be_stored_is_told_once(tmp_path, monkeypatch, caplog):
    """A failed store (a full disk) is a warning with its cause the first time, not only a
    debug line: every later start compiles again."""
    from embedl_dynamo.cache import files
    from embedl_dynamo.cache.store import ArtifactCache

    monkeypatch.setattr(files, "_TOLD_UNSTORED", set())

    real_put = ArtifactCache.put

    def full_disk(self, key, data, suffix=".onnx", *args, **kwargs):  # the blob's store fails
        if suffix == ".blob":
            raise OSError(28, "No space left on device")
        return real_put(self, key, data, suffix, *args, **kwargs)

    monkeypatch.setattr(ArtifactCache, "put", full_disk)
    model, x = randomize_batchnorm(ResNetLike().eval()), torch.randn(2, 3, 16, 16)
    with caplog.at_level(logging.DEBUG, logger=files.__name__):
        for _ in range(2):
            with torch.no_grad():
                _build(tmp_path, model, x).infer(x)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "OpenVINO's compiled model" in warned[0], warned
    assert "No space left on device" in warned[0] and not _blobs(tmp_path)
