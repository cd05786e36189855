"""A cache entry's checksum sidecar (``<file>.meta.json``: its BLAKE3 digest, size, its
companion's, and with a cache key its tag) and the checks against it: the cheap one (present,
readable, sizes, the tag: :mod:`~embedl_dynamo.cache.tags`), the full one (the digest,
:func:`~embedl_dynamo.cache.digests.file_digest`), and the full one run on a helper thread
while the caller reads the file (:class:`PendingChecksum`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.companion import companion_problem
from embedl_dynamo.cache.digests import DIGEST, file_digest
from embedl_dynamo.cache.files import atomic_write_text, run_in_background
from embedl_dynamo.cache.keys import jsonable
from embedl_dynamo.cache.tags import TAG, cache_key, entry_tag, tag_problem

__all__ = [
    "PendingChecksum",
    "hash_problem",
    "recorded_digest",
    "sidecar_path",
    "sidecar_problem",
    "write_sidecar",
]


def sidecar_path(path: Path) -> Path:
    """The checksum sidecar of the entry at ``path``."""
    return path.with_name(path.name + ".meta.json")


def write_sidecar(path: Path, record: dict[str, Any]) -> None:
    """Write the sidecar of the entry at ``path`` atomically: ``record`` (digest, size, meta,
    companion) as JSON, and its tag when a cache key is set (:mod:`~embedl_dynamo.cache.tags`)."""
    document = json.loads(json.dumps(jsonable(record)))  # the record as a reader parses it
    key = cache_key()
    if key is not None:
        document[TAG] = entry_tag(key, path, document)
    atomic_write_text(sidecar_path(path), json.dumps(document, sort_keys=True))


def sidecar_problem(path: Path) -> tuple[str | None, dict[str, Any]]:
    """``(problem, record)``: what is wrong short of hashing the file (missing, sidecar
    missing/unreadable/malformed, no valid tag under the cache key, size mismatch), or None,
    and the sidecar's record (empty with a problem). The full check,
    :func:`hash_problem`, takes this record: the sidecar is read and judged once."""
    if not path.exists():
        return "artifact file missing", {}
    try:
        meta = json.loads(sidecar_path(path).read_text())
    except FileNotFoundError:
        return "checksum sidecar missing", {}
    except (OSError, ValueError) as exc:
        return f"checksum sidecar unreadable: {exc}", {}
    if not isinstance(meta, dict) or DIGEST not in meta or "size" not in meta:
        return "checksum sidecar malformed", {}
    untagged = tag_problem(path, meta, cache_key())
    if untagged is not None:
        return untagged, {}
    size = path.stat().st_size
    if size != meta["size"]:
        return f"size {size} != recorded {meta['size']}", {}
    return companion_problem(path, meta.get("companion"), False), meta


def hash_problem(path: Path, record: dict[str, Any]) -> str | None:
    """ "checksum mismatch" unless the file hashes to the digest its sidecar ``record``
    (from :func:`sidecar_problem`) holds, and its companion to the companion's."""
    if file_digest(path) != str(record[DIGEST]):
        return "checksum mismatch"
    return companion_problem(path, record.get("companion"), True)


def recorded_digest(path: Path) -> str | None:
    """The digest the sidecar of ``path`` records for its bytes (and its companion's, after a
    ``+``), read without hashing: what a file derived from the entry is keyed by, so that an
    entry replaced by other bytes under the same key is not served a stale derivation. None
    when the sidecar is absent or unreadable."""
    try:
        record = json.loads(sidecar_path(path).read_text())
        digest = str(record[DIGEST])
        companion = record.get("companion")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return f"{digest}+{companion[DIGEST]}" if isinstance(companion, dict) else digest


class PendingChecksum:
    """An entry's checksum, verified on a helper thread from :meth:`start` (at most once).
    Calling it waits for the check (starting it if needed); a problem found goes to
    ``corrupt(problem)``, which raises, in the caller's thread: nothing is removed under a
    reader still opening the file.

    Args:
        check: returns the problem found (:func:`hash_problem`), or None.
        corrupt: called with it; raises.
    """

    def __init__(self, check: Callable[[], str | None], corrupt: Callable[[str], None]) -> None:
        self._check = check
        self._corrupt = corrupt
        self._running: Future[str | None] | None = None

    def start(self) -> None:
        if self._running is None:
            self._running = run_in_background(self._check, "embedl-verify")

    def problem(self) -> str | None:
        """Wait for the check (starting it if needed) and return the problem found, or None;
        nothing is removed: for a reader that only needs the verdict."""
        self.start()
        assert self._running is not None
        return self._running.result()

    def __call__(self) -> None:
        problem = self.problem()
        if problem is not None:
            self._corrupt(problem)
