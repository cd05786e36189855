"""The companion of a cache entry: a second file an artifact needs beside it, one at most.

An ONNX model over protobuf's 2 GiB keeps its weights in ``<name>.data`` next to ``<name>``
(:mod:`embedl_dynamo.onnx.external_data`); a builder writes it beside the artifact under that
name, and :class:`~embedl_dynamo.cache.store.ArtifactCache` moves it in, records its digest and
size in the entry's sidecar, verifies and removes it with the artifact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.digests import DIGEST, file_digest
from embedl_dynamo.cache.hashed_file import written_digest

__all__ = ["COMPANION_SUFFIX", "companion_path", "companion_problem", "move_companion"]

COMPANION_SUFFIX = ".data"


def companion_path(path: Path) -> Path:
    """The companion of the artifact at ``path``: ``<name>.data``."""
    return path.with_name(path.name + COMPANION_SUFFIX)


def move_companion(src: Path, path: Path) -> dict[str, Any] | None:
    """Move ``src``'s companion, if it has one, in beside ``path``.

    Returns:
        Its ``{"blake3", "size"}`` for the entry's sidecar; None when ``src`` has none.
    """
    data, target = companion_path(src), companion_path(path)
    if not data.exists():
        return None
    digest = written_digest(data) or file_digest(data)
    try:
        os.replace(data, target)
    except OSError:  # another filesystem
        shutil.copyfile(data, target)
    return {DIGEST: digest, "size": target.stat().st_size}


def companion_problem(path: Path, record: Any, hash_it: bool) -> str | None:
    """What is wrong with the companion of ``path`` against its sidecar ``record`` (None when
    the entry has none): missing, another size, or (``hash_it``) another digest."""
    if record is None:
        return None
    data = companion_path(path)
    if not isinstance(record, dict) or not data.exists():
        return f"{data.name} missing"
    if data.stat().st_size != record.get("size"):
        return f"{data.name}: size {data.stat().st_size} != recorded {record.get('size')}"
    if hash_it and file_digest(data) != record.get(DIGEST):
        return f"{data.name}: checksum mismatch"
    return None
