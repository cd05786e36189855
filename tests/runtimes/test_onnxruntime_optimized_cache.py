"""ONNX Runtime's optimised graphs in the artifact cache: a compile writes the graph ONNX
Runtime optimised on a helper thread (once its file is stored, or once a session over a cached
artifact without one is running), and later sessions run it without optimising again, with
the same outputs bit for bit. The models here are small: the size bound is lowered to take
them."""

from __future__ import annotations

import logging
import stat

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.cache import checksums, files
from embedl_dynamo.runtimes.onnxruntime import optimized_cache
from embedl_dynamo.runtimes.onnxruntime.optimized_cache import LOADED, OPTIMIZED_GRAPH, WRITING
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.settings import Settings
from tests.helpers import replace_cache_file
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.skipif(not OnnxRuntime.is_available(), reason=f"{OnnxRuntime.missing()}")

X = torch.randn(2, 3, 16, 16)


@pytest.fixture(autouse=True)
def small_artifacts_kept(monkeypatch):
    monkeypatch.setattr(optimized_cache, "MIN_ARTIFACT_BYTES", 0)


def _model():
    torch.manual_seed(0)
    return randomize_batchnorm(ResNetLike().eval())


def _build(cache_dir, model, key=None):
    """A runtime built over ``model``: exported (``key`` None) or from the cached artifact."""
    runtime = OnnxRuntime(Settings(cache_dir=cache_dir, num_threads=1))
    if key is not None:
        assert runtime.use_cached(key)
    runtime.build(torch.fx.symbolic_trace(model), [X])
    embedl_dynamo.wait_for_cache_writes()
    return runtime


def _entries(root):
    return sorted((root / "onnxruntime_optimized").rglob("*.onnx"))


@pytest.fixture
def hashed(monkeypatch):
    """The files whose sha256 the cache computes."""
    paths = []
    real = checksums.file_digest
    monkeypatch.setattr(checksums, "file_digest", lambda p: paths.append(p) or real(p))
    return paths


def test_a_compile_writes_the_optimised_graph_and_later_sessions_load_it(tmp_path, hashed):
    model = _model()
    fresh = _build(tmp_path, model)  # its session from memory; the graph written meanwhile
    assert OPTIMIZED_GRAPH not in fresh.build_info and len(_entries(tmp_path)) == 1
    key = fresh.build_info["key"]
    hashed.clear()
    loader = _build(tmp_path, model, key)
    assert loader.build_info[OPTIMIZED_GRAPH] == LOADED
    # the optimised graph is checked; the artifact it came from is neither read nor hashed
    assert hashed and all("onnxruntime_optimized" in str(p) for p in hashed)
    with torch.no_grad():
        assert torch.equal(loader.infer(X)[0], fresh.infer(X)[0])


def test_a_session_over_a_cached_artifact_writes_a_missing_entry_on_a_helper_thread(
    tmp_path, monkeypatch
):
    """Regression: the entry was written while the session was created, so a start that
    found none (another CPU's cache, an evicted entry) waited for ONNX Runtime to write the
    graph and for two files to be hashed: longer than a start with no such cache at all."""
    model = _model()
    fresh = _build(tmp_path, model)
    key = fresh.build_info["key"]
    for path in (tmp_path / "onnxruntime_optimized").rglob("*.*"):
        path.unlink()
    started = []
    monkeypatch.setattr(optimized_cache, "write_in_background", started.append)
    runtime = OnnxRuntime(Settings(cache_dir=tmp_path, num_threads=1))
    assert runtime.use_cached(key)
    runtime.build(torch.fx.symbolic_trace(model), [X])  # running before anything is written
    assert runtime.build_info[OPTIMIZED_GRAPH] == WRITING and not _entries(tmp_path)
    with torch.no_grad():
        assert torch.equal(runtime.infer(X)[0], fresh.infer(X)[0])
    (write,) = started
    write()  # what the helper thread runs
    assert len(_entries(tmp_path)) == 1
    assert _build(tmp_path, model, key).build_info[OPTIMIZED_GRAPH] == LOADED


def test_a_corrupt_artifact_gets_no_optimised_graph(tmp_path, monkeypatch):
    """The helper thread stores a graph only once the artifact's checksum is right, and leaves
    the corrupt artifact for the runtime to refuse and remove (by then it may be rebuilt)."""
    from embedl_dynamo.errors import CorruptEntryError

    model = _model()
    key = _build(tmp_path, model).build_info["key"]
    for path in (tmp_path / "onnxruntime_optimized").rglob("*.*"):
        path.unlink()
    (artifact,) = (tmp_path / "onnx").rglob("*.onnx")
    raw = bytearray(artifact.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a weight: the file still loads, its size matches
    artifact.write_bytes(bytes(raw))
    helper = []

    def run_now(work):  # the helper's work, before the runtime confirms the artifact
        try:
            work()
        except CorruptEntryError as exc:
            helper.append((exc, artifact.exists()))

    monkeypatch.setattr(optimized_cache, "write_in_background", run_now)
    runtime = OnnxRuntime(Settings(cache_dir=tmp_path, num_threads=1))
    assert runtime.use_cached(key)
    with pytest.raises(CorruptEntryError):
        runtime.build(torch.fx.symbolic_trace(model), [X])
    (exc, kept), *_ = helper
    assert "checksum mismatch" in str(exc) and kept  # told, and removed nothing
    assert not _entries(tmp_path) and not artifact.exists()  # the runtime removed it


def test_a_small_artifact_keeps_no_optimised_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(optimized_cache, "MIN_ARTIFACT_BYTES", 32 << 20)
    key = _build(tmp_path, _model()).build_info["key"]
    assert OPTIMIZED_GRAPH not in _build(tmp_path, _model(), key).build_info
    assert not _entries(tmp_path)


def test_a_corrupt_entry_is_found_the_session_built_from_the_artifact_and_the_entry_replaced(
    tmp_path, caplog
):
    model = _model()
    fresh = _build(tmp_path, model)
    key, expected = fresh.build_info["key"], fresh.infer(X)[0]
    (entry,) = _entries(tmp_path)
    data = entry.with_name(entry.name + ".data")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a weight: the file still loads, its size matches
    data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        again = _build(tmp_path, model, key)
    assert "corrupt" in caplog.text
    assert again.build_info[OPTIMIZED_GRAPH] == WRITING  # stored anew
    assert torch.equal(again.infer(X)[0], expected)
    assert _build(tmp_path, model, key).build_info[OPTIMIZED_GRAPH] == LOADED


def test_an_artifact_replaced_by_other_bytes_is_not_served_the_old_graph(tmp_path):
    model, other = _model(), randomize_batchnorm(ResNetLike().eval())
    key = _build(tmp_path, model).build_info["key"]  # and the optimised graph of its artifact
    (artifact,) = (tmp_path / "onnx").rglob("*.onnx")
    wrong = _build(tmp_path / "other", other)
    replace_cache_file(artifact, open(wrong.build_info["artifact"], "rb").read())
    runtime = OnnxRuntime(Settings(cache_dir=tmp_path, num_threads=1))
    assert runtime.use_cached(key)
    runtime.build(torch.fx.symbolic_trace(model), [X])  # the warm start's judge would refuse it
    embedl_dynamo.wait_for_cache_writes()
    assert runtime.build_info[OPTIMIZED_GRAPH] == WRITING  # another entry
    with torch.no_grad():
        assert torch.equal(runtime.infer(X)[0], wrong.infer(X)[0])  # the bytes it holds
    assert len(_entries(tmp_path)) == 2


def test_a_read_only_cache_loads_what_it_holds_and_writes_nothing(tmp_path, monkeypatch):
    model = _model()
    key = _build(tmp_path / "a", model).build_info["key"]
    key_b = _build(tmp_path / "b", model).build_info["key"]
    for path in (tmp_path / "b" / "onnxruntime_optimized").rglob("*.*"):
        path.unlink()  # no optimised graph in this one
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_READ_ONLY", "1")
    for root in (tmp_path / "a", tmp_path / "b"):
        before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
        runtime = _build(root, model, key if root.name == "a" else key_b)
        assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
        assert runtime.build_info.get(OPTIMIZED_GRAPH) == (LOADED if root.name == "a" else None)


def test_a_file_from_elsewhere_is_optimised_as_it_is_and_not_kept(tmp_path, monkeypatch):
    built = _build(tmp_path / "cache", _model())
    path = tmp_path / "model.onnx"
    path.write_bytes(open(built.build_info["artifact"], "rb").read())
    path.chmod(stat.S_IRUSR)
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "default"))
    loaded = OnnxRuntime.load_artifact(path, Settings(cache_dir=tmp_path / "default"))
    loaded.activate()
    assert OPTIMIZED_GRAPH not in loaded.build_info
    assert not (tmp_path / "default" / "onnxruntime_optimized").exists()


def test_a_weight_only_graph_loaded_optimised_gives_the_same_outputs_bit_for_bit(tmp_path):
    """int4 weight-only: the optimised graph holds the MatMulNBits ONNX Runtime fused (codes
    re-laid out, accuracy level baked in); run with optimisations off it computes the same."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    ).eval()
    x = torch.randn(4, 256)
    options = {"cache_dir": tmp_path, "precision": "int4_weight_only", "accuracy_budget": 0.01}
    outputs, graphs = [], []
    for _ in range(2):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)
        with torch.no_grad():
            outputs.append(compiled(x))
        embedl_dynamo.wait_for_cache_writes()
        (report,) = embedl_dynamo.last_report().subgraphs
        graphs.append(report.runtime_info.get(OPTIMIZED_GRAPH))
    assert graphs == [None, LOADED] and len(_entries(tmp_path)) == 1
    assert torch.equal(outputs[0], outputs[1])


def test_a_graph_that_cannot_be_stored_is_told_once_a_process(tmp_path, monkeypatch, caplog):
    """A full disk made every start optimise its graphs again, with nothing above debug level
    to say why: the first failure is a warning naming the cache and the cause, later ones are
    debug only."""
    monkeypatch.setattr(files, "_TOLD_UNSTORED", set())

    def full_disk(*args, **kwargs):
        raise RuntimeError("Failed to write external initializers to file (no space left)")

    monkeypatch.setattr(optimized_cache, "_written", full_disk)
    with caplog.at_level(logging.DEBUG, logger=files.__name__):
        for _ in range(2):
            _build(tmp_path / "cache", _model())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, caplog.records
    assert "no space left" in warned[0].getMessage()
    assert str(tmp_path / "cache") in warned[0].getMessage()
    assert any(
        r.levelno == logging.DEBUG and "not cached" in r.getMessage() for r in caplog.records
    )
    assert not _entries(tmp_path / "cache")
