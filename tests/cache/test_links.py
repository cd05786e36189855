"""The cache deletes only what it wrote, never through a link (issue 51 item 8), and writes
only into an empty or new directory, or one it marked."""

from __future__ import annotations

import logging
import os

import pytest
import torch

import embedl_dynamo.cache.files as files
from embedl_dynamo.cache.budget import ENV_CACHE_MAX_SIZE, cache_entries, clear_cache
from embedl_dynamo.cache.files import CACHE_MARKER, ENV_CACHE_READ_ONLY, env_flag
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.cli import EXIT_OK, main
from embedl_dynamo.errors import ConfigurationError, NotACacheError
from embedl_dynamo.settings import Settings


def _entry_shaped(folder, key, with_sidecar=True):
    """A file named as the store names an entry (and a sidecar like the store's): not ours."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.onnx"
    path.write_bytes(b"the user's own file" * 50)
    if with_sidecar:
        (folder / f"{key}.onnx.meta.json").write_text('{"blake3": "00", "size": 950}')
    return path


def _outside(tmp_path):
    """Entry-shaped files outside the cache, and the links a cache could be given to them."""
    key = content_key("outside")
    bucket = tmp_path / "outside" / "onnx" / key[:2]
    files = [_entry_shaped(bucket, key)]
    files += [bucket / f"{key}.onnx.meta.json", bucket / f"{key}.lock"]
    files[-1].write_bytes(b"")
    return key, files


def _plant_links(root, tmp_path):
    """A namespace that is a link, and a key folder that is a link, both to the outside."""
    key, files = _outside(tmp_path)
    (root / "elsewhere").symlink_to(tmp_path / "outside" / "onnx", target_is_directory=True)
    (root / "onnx").mkdir(exist_ok=True)
    (root / "onnx" / key[:2]).symlink_to(files[0].parent, target_is_directory=True)
    return files


def test_eviction_never_follows_a_link_out_of_the_cache(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(ENV_CACHE_MAX_SIZE, "3000")
    root = tmp_path / "cache"
    cache = ArtifactCache(root, "calibration")
    old = cache.put(content_key("old"), b"o" * 900, ".json")
    outside = _plant_links(root, tmp_path)
    assert len(cache_entries(root)) == 1  # the linked folders are not the cache's
    os.utime(old, (1, 1))
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache"):
        for i in range(3):
            cache.put(content_key("new", i), b"n" * 900, ".json")
    assert not old.exists()  # the budget still evicts the cache's own entries
    assert all(p.exists() for p in outside)
    assert "symbolic link" in caplog.text


def test_clear_never_follows_a_link_and_keeps_it(tmp_path):
    root = tmp_path / "cache"
    ArtifactCache(root, "onnx").put(content_key("mine"), b"x" * 100, ".onnx")
    outside = _plant_links(root, tmp_path)
    assert main(["cache", "clear", "--cache-dir", str(root)]) == EXIT_OK
    assert all(p.exists() for p in outside)
    assert (root / "elsewhere").is_symlink() and cache_entries(root) == []


def test_clear_keeps_an_entry_shaped_file_without_the_stores_sidecar(tmp_path):
    root = tmp_path / "cache"
    cache = ArtifactCache(root, "onnx")
    key = content_key("mine")
    cache.put(key, b"x" * 100, ".onnx")
    theirs = content_key("theirs")
    user_file = _entry_shaped(root / "onnx" / theirs[:2], theirs, with_sidecar=False)
    stale_lock = root / "onnx" / key[:2] / f"{key}.lock"
    stale_lock.write_bytes(b"")
    freed = clear_cache(root)
    assert freed >= 100 and cache.get(key, ".onnx") is None and not stale_lock.exists()
    assert user_file.exists()


def test_a_folder_holding_files_is_not_adopted_as_a_cache(tmp_path):
    root = tmp_path / "project"
    key = content_key("theirs")
    user_file = _entry_shaped(root / "onnx" / key[:2], key, with_sidecar=False)
    with pytest.raises(NotACacheError, match=r"already holds files \(onnx\).*empty or new"):
        ArtifactCache(root, "onnx").put(content_key("mine"), b"x", ".onnx")
    with pytest.raises(NotACacheError):
        ArtifactCache(root, "onnx").get_or_build(content_key("m"), lambda p: p.write_bytes(b"x"))
    assert not (root / CACHE_MARKER).exists()
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == [user_file.name]
    with pytest.raises(NotACacheError, match="nothing was deleted"):
        clear_cache(root)
    assert user_file.exists()


def test_a_folder_another_process_claims_meanwhile_is_a_cache(tmp_path, monkeypatch):
    """Two first users of a new cache directory: the other one marks it and writes its first
    entry between this one's look for the marker and its listing (a thread of the same
    process lost its build to NotACacheError this way)."""
    root = tmp_path / "new"
    looks = []

    def other_claims_between(path):
        looks.append(path)
        if len(looks) == 1:  # the first look: not marked yet; then the other writes
            (root / "onnx").mkdir(parents=True)
            (root / CACHE_MARKER).write_text("marked")
            return False
        return (path / CACHE_MARKER).is_file()

    monkeypatch.setattr(files, "is_cache_root", other_claims_between)
    files.claim_cache_root(root)
    assert len(looks) == 2 and (root / CACHE_MARKER).read_text() == "marked"


def test_a_new_or_empty_folder_becomes_a_cache(tmp_path):
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "empty", tmp_path / "new" / "deep"):
        path = ArtifactCache(root, "onnx").put(content_key("x"), b"x", ".onnx")
        assert (root / CACHE_MARKER).is_file() and path.exists()


def test_a_namespace_folder_that_is_a_link_is_neither_read_nor_written(tmp_path, caplog):
    root = tmp_path / "cache"
    ArtifactCache(root, "calibration").put(content_key("first"), b"x", ".json")
    (tmp_path / "elsewhere").mkdir()
    (root / "onnx").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    cache = ArtifactCache(root, "onnx")
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache"):
        path, built = cache.get_or_build(content_key("m"), lambda p: p.write_bytes(b"m"), ".onnx")
    assert built and root not in path.parents and path.read_bytes() == b"m"
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert "symbolic link" in caplog.text


@pytest.mark.parametrize("word", ["1", "TRUE", " yes ", "0", "false", "No", ""])
def test_the_read_only_flag_takes_yes_and_no_words(word):
    assert env_flag(ENV_CACHE_READ_ONLY, {ENV_CACHE_READ_ONLY: word}) == (
        word.strip().lower() in ("1", "true", "yes")
    )


@pytest.mark.parametrize("word", ["on", "off", "enabled", "ture"])
def test_an_unknown_read_only_word_stops_the_compile_naming_the_words(monkeypatch, tmp_path, word):
    """Regression (issue 51 item 9): ``on`` or a typo sent the whole model to PyTorch, with
    warnings only."""
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, word)
    message = rf"invalid {ENV_CACHE_READ_ONLY}='{word}': expected 1, true, yes for yes .*0, false"
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_options({"cache_dir": tmp_path})
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    compiled = torch.compile(model.eval(), backend="embedl_onnxruntime")
    with torch.no_grad(), pytest.raises(Exception, match=message) as caught:
        compiled(torch.randn(2, 4))
    assert isinstance(getattr(caught.value, "inner_exception", caught.value), ConfigurationError)
