"""Write a file and its checksum (BLAKE3) at once, the hash computed on a helper thread.

:meth:`~embedl_dynamo.cache.store.ArtifactCache.put` records every artifact's digest in its
sidecar. Reading a large ONNX file back just to hash it reads every byte a second time; a
builder that writes through :func:`open_hashed` has its bytes hashed while they are written
(``write`` and ``blake3`` both release the GIL, so the two overlap on two cores), and ``put``
takes the digest from :func:`written_digest` instead of reading the file again.

The digest is only used for the very file that was written, at the size it was closed with;
anything else (renamed, appended to, another process's file) is hashed from disk as before.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3

__all__ = ["HashedWriter", "open_hashed", "written_digest"]

_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}  # path -> (identity, hex digest)
_LOCK = threading.Lock()
_DONE = object()


class HashedWriter:
    """A binary file writer whose bytes are hashed (BLAKE3) on a helper thread, in order."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._hash = blake3.blake3()
        self._pending: queue.Queue[Any] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._consume, name="embedl-hash", daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        while (block := self._pending.get()) is not _DONE:
            self._hash.update(block)

    def write(self, data: Any) -> int:
        """Write ``data`` (bytes or any C-contiguous buffer, kept alive until hashed)."""
        view = memoryview(data).cast("B")
        written = self._file.write(view)
        self._pending.put(view)
        return written

    def finish(self) -> str:
        """Wait for the hash of everything written; its hex digest."""
        self._pending.put(_DONE)
        self._thread.join()
        return self._hash.hexdigest()


@contextlib.contextmanager
def open_hashed(path: str | os.PathLike[str]) -> Iterator[HashedWriter]:
    """Open ``path`` for writing; on a clean exit, its digest is known to :func:`written_digest`."""
    path = Path(path)
    with open(path, "wb") as f:
        writer = HashedWriter(f)
        try:
            yield writer
        finally:
            digest = writer.finish()
    with _LOCK:
        _DIGESTS[str(path)] = (_identity(path), digest)


def _identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def written_digest(path: str | os.PathLike[str]) -> str | None:
    """The digest of ``path`` as :func:`open_hashed` wrote it, if it is still that file (same
    inode, size and modification time); None otherwise. Forgotten once asked."""
    with _LOCK:
        known = _DIGESTS.pop(str(Path(path)), None)
    if known is None:
        return None
    identity, digest = known
    try:
        return digest if _identity(Path(path)) == identity else None
    except OSError:
        return None
