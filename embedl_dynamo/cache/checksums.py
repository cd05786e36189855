"""A cache entry's checksum sidecar (``<file>.meta.json``: its BLAKE3 digest, size, its
companion's) and the checks against it: the cheap one (present, readable, sizes), the full one
(the digest, :func:`~embedl_dynamo.cache.digests.file_digest`), and
the full one run on a helper thread while the caller reads the file (:class:`PendingChecksum`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from embedl_dynamo.cache.companion import companion_problem
from embedl_dynamo.cache.digests import DIGEST, file_digest
from embedl_dynamo.cache.files import run_in_background

__all__ = [
    "PendingChecksum",
    "hash_problem",
    "recorded_digest",
    "sidecar_path",
    "sidecar_problem",
]


def sidecar_path(path: Path) -> Path:
    """The checksum sidecar of the entry at ``path``."""
    return path.with_name(path.name + ".meta.json")


def sidecar_problem(path: Path) -> tuple[str | None, str]:
    """``(problem, recorded digest)``: what is wrong short of hashing the file (missing,
    sidecar missing/unreadable/malformed, size mismatch), or None."""
    if not path.exists():
        return "artifact file missing", ""
    try:
        meta = json.loads(sidecar_path(path).read_text())
    except FileNotFoundError:
        return "checksum sidecar missing", ""
    except (OSError, ValueError) as exc:
        return f"checksum sidecar unreadable: {exc}", ""
    if not isinstance(meta, dict) or DIGEST not in meta or "size" not in meta:
        return "checksum sidecar malformed", ""
    size = path.stat().st_size
    if size != meta["size"]:
        return f"size {size} != recorded {meta['size']}", ""
    return companion_problem(path, meta.get("companion"), False), str(meta[DIGEST])


def hash_problem(path: Path, digest: str) -> str | None:
    """ "checksum mismatch" unless the file hashes to ``digest`` (and its companion to the
    digest its sidecar records)."""
    if file_digest(path) != digest:
        return "checksum mismatch"
    companion = json.loads(sidecar_path(path).read_text()).get("companion")
    return companion_problem(path, companion, True)


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
