"""A file written through ``open_hashed`` is hashed as written, and the cache trusts that
digest only for the very file that was written."""

from __future__ import annotations

import os

import numpy as np
import pytest

from embedl_dynamo.cache import checksums, store
from embedl_dynamo.cache.digests import file_digest
from embedl_dynamo.cache.hashed_file import open_hashed, written_digest
from embedl_dynamo.cache.store import ArtifactCache

KEY = "ab" * 32


def _write(path, blocks):
    with open_hashed(path) as f:
        for block in blocks:
            f.write(block)


def _blocks():
    rng = np.random.default_rng(0)
    return [b"header", rng.random(300_000).astype(np.float32), b"", memoryview(b"tail")]


def test_the_digest_is_the_files_own(tmp_path):
    path = tmp_path / "a.bin"
    _write(path, _blocks())
    assert written_digest(path) == file_digest(path)
    assert written_digest(path) is None  # forgotten once asked


def test_a_file_changed_after_writing_gets_no_digest(tmp_path):
    path = tmp_path / "a.bin"
    _write(path, _blocks())
    with open(path, "r+b") as f:  # same size, other bytes
        f.write(b"HEADER")
    os.utime(path, ns=(1, 1))
    assert written_digest(path) is None


def test_a_failed_write_records_nothing(tmp_path):
    path = tmp_path / "a.bin"
    with pytest.raises(RuntimeError), open_hashed(path) as f:
        f.write(b"partial")
        raise RuntimeError("builder failed")
    assert written_digest(path) is None


def test_put_takes_the_digest_instead_of_reading_the_file_again(tmp_path, monkeypatch):
    reads = []
    counted = lambda p: reads.append(p) or file_digest(p)  # noqa: E731
    monkeypatch.setattr(store, "file_digest", counted)  # where put hashes
    monkeypatch.setattr(checksums, "file_digest", counted)  # where get verifies
    cache = ArtifactCache(tmp_path / "cache", "onnx")
    built = tmp_path / "built.onnx"
    _write(built, _blocks())
    path = cache.put(KEY, built, ".onnx")
    assert not reads
    assert cache.get(KEY, ".onnx") == path  # verified from disk against the recorded digest
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(b"written without open_hashed")
    cache.put("cd" * 32, plain, ".onnx")
    assert len(reads) == 2  # the get above, then this file hashed from disk
