"""The digests of content: BLAKE3 for what the cache holds, sha256 for exported files.

A start hashes every weight of the model (its key, :mod:`~embedl_dynamo.cache.keys`) and every
file it reads from the cache (its checksum, :mod:`~embedl_dynamo.cache.checksums`), so those
use BLAKE3: cryptographic, and several times sha256's speed on one core, more on several. The
sidecar of an exported file records sha256 instead, which ``sha256sum`` checks too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import blake3

__all__ = ["DIGEST", "blake3_digest", "file_digest", "sha256_file"]

#: the name of a cache entry's digest in its sidecar
DIGEST = "blake3"
_BLOCK_BYTES = 1 << 20  # read into a buffer that stays in the core's cache while hashed


def blake3_digest(data: object) -> bytes:
    """The raw :data:`DIGEST` of a C-contiguous buffer's bytes (bytes, a numpy array of any
    dtype, a memoryview); ``.hex()`` of it is what a sidecar records."""
    return blake3.blake3(memoryview(data).cast("B")).digest()


def file_digest(path: Path) -> str:
    """Hex :data:`DIGEST` (BLAKE3) of a file's bytes: the checksum of a cache entry, verified
    each time the entry is read. Read in blocks into one buffer, not mapped: a file another
    program truncates while it is hashed then gives a wrong digest (the entry is rebuilt), not
    a crash (SIGBUS)."""
    h = blake3.blake3()
    block = bytearray(_BLOCK_BYTES)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as f:
        while read := f.readinto(block):
            h.update(view[:read])
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (what an exported file's sidecar
    records: ``sha256sum`` checks it too)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
