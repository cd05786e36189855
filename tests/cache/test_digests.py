"""The digests of :mod:`embedl_dynamo.cache.digests`: BLAKE3 for the cache, sha256 for exports."""

from __future__ import annotations

import hashlib

import numpy as np

from embedl_dynamo.cache.digests import blake3_digest, file_digest, sha256_file

# BLAKE3's published digest of the empty input
_EMPTY_BLAKE3 = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def test_an_empty_file_has_blake3s_empty_digest(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert file_digest(path) == blake3_digest(b"").hex() == _EMPTY_BLAKE3


def test_a_file_a_buffer_and_its_bytes_hash_alike(tmp_path):
    data = np.random.default_rng(0).random(3_000_000).astype(np.float32)  # several chunks
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    assert file_digest(path) == blake3_digest(data.tobytes()).hex() == blake3_digest(data).hex()
    data[1_234_567] += 1  # one value changed
    assert blake3_digest(data).hex() != file_digest(path)


def test_an_exported_file_is_recorded_by_its_sha256(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not really onnx" * 100_000)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()
