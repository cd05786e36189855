"""The cache's size budget: usage per namespace, least-recently-used eviction, clearing.

Every entry is an artifact plus its ``.meta.json`` sidecar (see :mod:`embedl_dynamo.cache.store`).
An entry's last use is its artifact's modification time: :meth:`ArtifactCache.get` touches it on
every hit, so eviction removes the entries no process has used for longest. After each ``put`` the
whole cache root is trimmed to the budget, oldest first, never removing the entry just written.

The budget is ``$EMBEDL_DYNAMO_CACHE_MAX_SIZE`` (bytes, or with a ``KB``/``MB``/``GB`` suffix;
``0`` or ``none`` means unlimited), else :data:`DEFAULT_MAX_BYTES` (5 GB, Torch-TensorRT's default
engine cache size).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV_CACHE_MAX_SIZE",
    "CacheEntry",
    "cache_entries",
    "clear_cache",
    "evict_to_budget",
    "max_cache_bytes",
    "parse_size",
]

logger = logging.getLogger(__name__)

ENV_CACHE_MAX_SIZE = "EMBEDL_DYNAMO_CACHE_MAX_SIZE"
DEFAULT_MAX_BYTES = 5 * 1024**3
_META = ".meta.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


@dataclass(frozen=True)
class CacheEntry:
    """One stored artifact: where it is, its bytes with the sidecar, and its last use."""

    namespace: str
    path: Path
    size: int
    last_used: float

    def remove(self) -> None:
        """Delete the artifact and its sidecar."""
        for p in (self.path, self.path.with_name(self.path.name + _META)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def parse_size(text: str) -> int | None:
    """``"5GB"``, ``"500 MB"``, ``"1048576"`` -> bytes; ``"0"``/``"none"`` -> None (no limit).

    Raises:
        ValueError: not a size.
    """
    if text.strip().lower() in ("none", "unlimited", "0"):
        return None
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"invalid cache size {text!r}: use bytes or e.g. '500MB', '5GB', 'none'")
    unit = (match.group(2) or "").lower()[:1]
    return int(float(match.group(1)) * _UNITS[unit]) or None


def max_cache_bytes() -> int | None:
    """The budget from ``$EMBEDL_DYNAMO_CACHE_MAX_SIZE``, else 5 GB; None means unlimited."""
    env = os.environ.get(ENV_CACHE_MAX_SIZE)
    return DEFAULT_MAX_BYTES if env is None or not env.strip() else parse_size(env)


def cache_entries(root: str | os.PathLike[str]) -> list[CacheEntry]:
    """Every complete entry under ``root`` (``<namespace>/<xx>/<key><suffix>`` with a sidecar)."""
    root = Path(root)
    entries = []
    for meta in root.glob(f"*/*/*{_META}"):
        if meta.is_symlink():
            continue
        path = meta.with_name(meta.name[: -len(_META)])
        with contextlib.suppress(OSError):
            stat = path.stat()
            size = stat.st_size + meta.stat().st_size
            entries.append(CacheEntry(meta.parent.parent.name, path, size, stat.st_mtime))
    return entries


def evict_to_budget(
    root: str | os.PathLike[str], max_bytes: int | None, keep: Path | None = None
) -> list[CacheEntry]:
    """Remove least-recently-used entries until the cache holds at most ``max_bytes``.

    Args:
        root: the cache root.
        max_bytes: the budget; None means unlimited.
        keep: an artifact never to remove (the one just written).

    Returns:
        The removed entries.
    """
    if max_bytes is None:
        return []
    entries = sorted(cache_entries(root), key=lambda e: e.last_used)
    total = sum(e.size for e in entries)
    removed = []
    for entry in entries:
        if total <= max_bytes:
            break
        if keep is not None and entry.path == keep:
            continue
        entry.remove()
        total -= entry.size
        removed.append(entry)
    if removed:
        logger.info(
            "cache %s over its %d-byte budget: evicted %d least recently used entries",
            root, max_bytes, len(removed),
        )  # fmt: skip
    return removed


def clear_cache(root: str | os.PathLike[str]) -> int:
    """Delete every namespace directory under ``root``; returns the bytes freed.

    Only directories holding our entry layout are removed, so a mistyped root that points at
    unrelated files is left alone.
    """
    root = Path(root)
    freed = 0
    namespaces = {e.namespace for e in cache_entries(root)}
    namespaces |= {p.parent.parent.name for p in root.glob("*/*/*.lock")}
    for name in sorted(namespaces):
        directory = root / name
        freed += sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        shutil.rmtree(directory, ignore_errors=True)
    return freed
