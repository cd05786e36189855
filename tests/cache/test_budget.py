"""The cache's size budget: LRU eviction, lock files removed, ``embedl-dynamo cache info|clear``."""

from __future__ import annotations

import os

import pytest
import torch

from embedl_dynamo.cache.budget import (
    DEFAULT_MAX_BYTES,
    ENV_CACHE_MAX_SIZE,
    cache_entries,
    clear_cache,
    max_cache_bytes,
    parse_size,
)
from embedl_dynamo.cache.files import CACHE_MARKER
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.cli import EXIT_OK, EXIT_USAGE, main
from embedl_dynamo.errors import ConfigurationError, NotACacheError
from embedl_dynamo.settings import Settings


def _age(path, seconds):
    st = path.stat()
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def test_put_evicts_least_recently_used_entries_over_budget(tmp_path, monkeypatch):
    """Regression (issue 12 item 18): the cache grew without limit."""
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "3000")
    cache = ArtifactCache(tmp_path, "onnx")
    keys = [content_key("entry", i) for i in range(3)]
    paths = [cache.put(k, b"x" * 900, ".onnx") for k in keys[:2]]
    _age(paths[0], 100)
    _age(paths[1], 50)
    assert cache.get(keys[0], ".onnx") is not None  # a hit makes entry 0 the most recent
    cache.put(keys[2], b"y" * 900, ".onnx")  # ~2.9 KB with sidecars: over 3000 bytes
    assert cache.get(keys[1], ".onnx") is None  # the least recently used went
    assert cache.get(keys[0], ".onnx") is not None and cache.get(keys[2], ".onnx") is not None
    assert sum(e.size for e in cache_entries(tmp_path)) <= 3000


def test_budget_spans_namespaces_and_keeps_the_entry_just_written(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "1KB")
    old = ArtifactCache(tmp_path, "calibration").put(content_key("a"), b"a" * 600, ".json")
    _age(old, 10)
    new = ArtifactCache(tmp_path, "onnx").put(content_key("b"), b"b" * 2000, ".onnx")
    assert not old.exists() and new.exists()  # larger than the budget, yet just built: kept


def test_derived_entries_are_evicted_before_artifacts_and_never_evict_one_in_use(
    tmp_path, monkeypatch
):
    # a runtime's own form of an artifact (OpenVINO's compiled model, ONNX Runtime's optimised
    # graph) is rebuilt from it cheaply: it goes first, and it never pushes out an entry this
    # process has used (every entry here was written by it)
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "3000")
    onnx, derived = ArtifactCache(tmp_path, "onnx"), ArtifactCache(tmp_path, "derived")
    used = onnx.put(content_key("used"), b"u" * 900, ".onnx")
    form = derived.put(content_key("form"), b"f" * 900, ".blob", meta={"derived": True})
    assert derived.room_for_derived(900) and not derived.room_for_derived(2000)
    new = onnx.put(content_key("new"), b"n" * 900, ".onnx")  # over 3000 bytes with sidecars
    assert used.exists() and new.exists() and not form.exists()
    other = derived.put(content_key("other"), b"o" * 500, ".blob", meta={"derived": True})
    big = derived.put(content_key("big"), b"b" * 1500, ".blob", meta={"derived": True})
    assert used.exists() and new.exists() and other.exists() and not big.exists()  # it went
    assert not derived.room_for_derived(1500)


def test_a_derived_entry_evicts_stale_derived_entries_and_never_an_artifact(tmp_path, monkeypatch):
    """Regression: a derived entry had to fit without evicting anything, so derived entries
    that no process had read since this one started (another CPU's, an old model's) kept the
    current model's out of a full cache for good."""
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "4000")
    onnx, derived = ArtifactCache(tmp_path, "onnx"), ArtifactCache(tmp_path, "derived")
    stale_artifact = onnx.put(content_key("stale artifact"), b"s" * 900, ".onnx")
    stale_form = derived.put(content_key("stale form"), b"f" * 900, ".blob", meta={"derived": True})
    _age(stale_artifact, 2 * 86400)  # last used before this process started
    _age(stale_form, 86400)
    used = onnx.put(content_key("used"), b"u" * 900, ".onnx")
    assert derived.room_for_derived(1500)  # once the stale derived entry is evicted
    form = derived.put(content_key("form"), b"n" * 1500, ".blob", meta={"derived": True})
    assert form.exists() and used.exists() and stale_artifact.exists() and not stale_form.exists()
    assert sum(e.size for e in cache_entries(tmp_path)) <= 4000
    assert not derived.room_for_derived(1500)  # only an artifact could make room now
    big = derived.put(content_key("big"), b"b" * 1500, ".blob", meta={"derived": True})
    assert not big.exists() and stale_artifact.exists() and form.exists()


def test_an_artifact_evicts_derived_entries_before_a_stale_artifact(tmp_path, monkeypatch):
    # a derived entry is rebuilt from its artifact in about a second, an artifact can take
    # minutes: even one this process uses goes before an artifact no process has used lately
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "3000")
    onnx, derived = ArtifactCache(tmp_path, "onnx"), ArtifactCache(tmp_path, "derived")
    stale = onnx.put(content_key("stale"), b"s" * 900, ".onnx")
    _age(stale, 86400)
    form = derived.put(content_key("form"), b"f" * 900, ".blob", meta={"derived": True})
    new = onnx.put(content_key("new"), b"n" * 900, ".onnx")  # over 3000 bytes with sidecars
    assert stale.exists() and new.exists() and not form.exists()


def test_lock_files_are_removed_after_a_build(tmp_path):
    """Regression (issue 12 item 18): one .lock file per key stayed forever."""
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("locked")
    cache.get_or_build(key, lambda p: p.write_bytes(b"built"), ".onnx")
    assert list(tmp_path.rglob("*.lock")) == []
    assert cache.get(key, ".onnx").read_bytes() == b"built"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1048576", 1048576), ("500MB", 500 * 1024**2), ("5 GB", 5 * 1024**3), ("none", None)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_bad_size_names_the_fix(monkeypatch):
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "lots")
    with pytest.raises(ValueError, match="'500MB'"):
        max_cache_bytes()
    monkeypatch.delenv(ENV_CACHE_MAX_SIZE)
    assert max_cache_bytes() == DEFAULT_MAX_BYTES


def test_cli_cache_info_and_clear(tmp_path, capsys):
    ArtifactCache(tmp_path, "onnx").put(content_key("c"), b"z" * 2048, ".onnx")
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("mine")
    assert main(["cache", "info", "--cache-dir", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "onnx" in out and "total" in out and " 1 " in out
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == EXIT_OK
    assert cache_entries(tmp_path) == [] and unrelated.read_text() == "mine"
    assert main(["cache", "info", "--cache-dir", str(tmp_path)]) == EXIT_OK
    assert "total      0" in capsys.readouterr().out


def _project_tree(root):
    """A directory a typo could name: a Rust and a Poetry project, and an ``X`` + meta pair."""
    (root / "crate" / "sub").mkdir(parents=True)
    (root / "crate" / "sub" / "Cargo.lock").write_text("lock")
    (root / "py" / "deps").mkdir(parents=True)
    (root / "py" / "deps" / "poetry.lock").write_text("lock")
    (root / "notes" / "ab").mkdir(parents=True)
    (root / "notes" / "ab" / "report").write_text("data")
    (root / "notes" / "ab" / "report.meta.json").write_text("{}")
    return sorted(
        p for p in root.rglob("*") if p.parts[len(root.parts)] in ("crate", "py", "notes")
    )


def test_clear_refuses_a_directory_that_is_not_a_cache(tmp_path, capsys):
    """Regression (issue 23 item 10): a mistyped --cache-dir lost every folder holding a
    ``*/*/*.lock`` file or an ``X`` + ``X.meta.json`` pair, and said "0.0 MB freed"."""
    before = _project_tree(tmp_path)
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not an embedl_dynamo cache" in err and "nothing was deleted" in err
    assert sorted(tmp_path.rglob("*")) == before and len(before) == 10
    with pytest.raises(NotACacheError, match="EMBEDL_DYNAMO_CACHE_DIR"):
        clear_cache(tmp_path)


def test_clear_deletes_only_what_the_store_wrote(tmp_path):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("entry")
    cache.put(key, b"x" * 100, ".onnx")
    before = _project_tree(tmp_path)  # someone else's files inside the cache root
    stray = tmp_path / "onnx" / key[:2] / "README"
    stray.write_text("not ours")
    assert (tmp_path / CACHE_MARKER).is_file()
    freed = clear_cache(tmp_path)
    assert freed >= 100
    assert cache.get(key, ".onnx") is None and cache_entries(tmp_path) == []
    assert stray.read_text() == "not ours"
    assert before and all(p.exists() for p in before)
    assert not (tmp_path / "onnx" / key[:2] / f"{key}.onnx").exists()


@pytest.mark.parametrize("value", ["abc", "-5"])
def test_a_bad_cache_size_stops_the_compile_with_a_clear_error(monkeypatch, tmp_path, value):
    """Regression (issue 39 item 7): the error was swallowed by each cache write, so the whole
    model ran in PyTorch with one stderr line."""
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, value)
    message = rf"invalid {ENV_CACHE_MAX_SIZE}='{value}': .*'500MB'.*'none'"
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_options({"cache_dir": tmp_path})
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    compiled = torch.compile(model.eval(), backend="embedl_onnxruntime")
    with torch.no_grad(), pytest.raises(Exception, match=message) as caught:
        compiled(torch.randn(2, 4))
    assert isinstance(getattr(caught.value, "inner_exception", caught.value), ConfigurationError)
