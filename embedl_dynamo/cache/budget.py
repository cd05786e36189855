"""The cache's size budget: usage per namespace, least-recently-used eviction, clearing.

Every entry is an artifact plus its ``.meta.json`` sidecar (see :mod:`embedl_dynamo.cache.store`).
An entry's last use is its artifact's modification time: :meth:`ArtifactCache.get` touches it on
every hit, so eviction removes the entries no process has used for longest. After each ``put`` the
whole cache root is trimmed to the budget, oldest first, never removing the entry just written.
*Derived* entries (a runtime's own form of an artifact, such as OpenVINO's compiled model or
ONNX Runtime's optimised graph: their sidecar's metadata says ``"derived": true``) go first,
since they are rebuilt from their artifact in a second or so, where an artifact can take
minutes. A derived entry just written pushes out only *stale* derived entries, those no process
has used since this one started (:data:`PROCESS_START`), and removes itself where they leave no
room: it never evicts an artifact, nor a derived entry this start (or a replica beside it)
reads, so two models sharing a full cache do not evict each other's artifacts for a second
saved per start.

The budget is ``$EMBEDL_DYNAMO_CACHE_MAX_SIZE`` (bytes, or with a ``KB``/``MB``/``GB`` suffix;
``0`` or ``none`` means unlimited), else :data:`DEFAULT_MAX_BYTES` (5 GB, Torch-TensorRT's default
engine cache size).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from embedl_dynamo.cache.companion import companion_path
from embedl_dynamo.cache.files import CACHE_MARKER, is_cache_root
from embedl_dynamo.errors import ConfigurationError, NotACacheError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV_CACHE_MAX_SIZE",
    "PROCESS_START",
    "CacheEntry",
    "cache_entries",
    "clear_cache",
    "evict_to_budget",
    "max_cache_bytes",
    "parse_size",
    "room_for_derived",
]

logger = logging.getLogger(__name__)

ENV_CACHE_MAX_SIZE = "EMBEDL_DYNAMO_CACHE_MAX_SIZE"
DEFAULT_MAX_BYTES = 5 * 1024**3
#: when this process loaded the cache's code: a derived entry last used before it is stale (no
#: process has read it since), and only such an entry makes room for another derived one
PROCESS_START = time.time()
_META = ".meta.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
# how ArtifactCache names what it writes: <namespace>/<key[:2]>/<key><suffix>, a sidecar
# <key><suffix>.meta.json, a lock <key>.lock and temporary files .<name>.<random>.tmp
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_ENTRY = re.compile(r"^(?P<key>[0-9a-f]{16,128})(\.[A-Za-z0-9_]{1,16}){0,5}$")
_TEMPORARY = re.compile(r"^\.(?P<name>[0-9a-f]{16,128}[A-Za-z0-9_.]*)\.[A-Za-z0-9_]+\.tmp$")


@dataclass(frozen=True)
class CacheEntry:
    """One stored artifact: where it is, its bytes with the sidecar, and its last use."""

    namespace: str
    path: Path
    size: int
    last_used: float
    derived: bool = False

    def remove(self) -> None:
        """Delete the artifact and its sidecar."""
        for p in (
            self.path,
            companion_path(self.path),
            self.path.with_name(self.path.name + _META),
        ):
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


def max_cache_bytes(env: Mapping[str, str] | None = None) -> int | None:
    """The budget from ``$EMBEDL_DYNAMO_CACHE_MAX_SIZE`` (in ``env``, ``os.environ`` when
    None), else 5 GB; None means unlimited.

    Raises:
        ConfigurationError: the variable holds no size (``abc``, ``-5``); the message names it,
            its value and the valid forms. Checked when settings are made, so a bad value stops
            the compile instead of failing each cache write.
    """
    value = (os.environ if env is None else env).get(ENV_CACHE_MAX_SIZE)
    if value is None or not value.strip():
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(value)
    except ValueError:
        raise ConfigurationError(
            f"invalid {ENV_CACHE_MAX_SIZE}={value!r}: the cache's size budget is a number of "
            "bytes or a size such as '500MB' or '5GB' (suffixes KB, MB, GB, TB), or '0'/'none' "
            "for no limit"
        ) from None


def written_by_store(path: Path) -> bool:
    """Whether ``path`` is named as the store names what it writes (see ``_ENTRY``): a file
    ``<namespace>/<key[:2]>/<key><suffix>`` (or its sidecar, lock or temporary file)."""
    name = path.name
    temporary = _TEMPORARY.match(name)
    if temporary:
        name = temporary.group("name")
    entry = _ENTRY.match(name)
    return bool(
        entry
        and path.parent.name == entry.group("key")[:2]
        and _NAMESPACE.match(path.parent.parent.name)
    )


def cache_entries(root: str | os.PathLike[str]) -> list[CacheEntry]:
    """Every complete entry under ``root`` (``<namespace>/<xx>/<key><suffix>`` with a sidecar)."""
    root = Path(root)
    entries = []
    for meta in root.glob(f"*/*/*{_META}"):
        if meta.is_symlink() or not written_by_store(meta):
            continue
        path = meta.with_name(meta.name[: -len(_META)])
        with contextlib.suppress(OSError):
            stat = path.stat()
            size = stat.st_size + meta.stat().st_size
            with contextlib.suppress(OSError):
                size += companion_path(path).stat().st_size
            entries.append(CacheEntry(meta.parent.parent.name, path, size, stat.st_mtime,
                                      _is_derived(meta)))  # fmt: skip
    return entries


def _is_derived(meta: Path) -> bool:
    try:
        record = json.loads(meta.read_text())
        return bool(record.get("meta", {}).get("derived", False))
    except (OSError, ValueError, AttributeError):
        return False


def evict_to_budget(
    root: str | os.PathLike[str], max_bytes: int | None, keep: Path | None = None
) -> list[CacheEntry]:
    """Remove entries until the cache holds at most ``max_bytes``: derived entries first, then
    the others, each least recently used first (see the module).

    Args:
        root: the cache root.
        max_bytes: the budget; None means unlimited.
        keep: the entry just written: never removed, unless it is derived and the stale derived
            entries (:data:`PROCESS_START`) are too few to make room for it; a derived ``keep``
            evicts nothing else.

    Returns:
        The removed entries.
    """
    if max_bytes is None:
        return []
    entries = sorted(cache_entries(root), key=lambda e: (not e.derived, e.last_used))
    total = sum(e.size for e in entries)
    kept = next((e for e in entries if e.path == keep), None)
    if kept is not None and kept.derived:  # the stale derived entries, then itself
        entries = [e for e in entries if _stale_derived(e) and e is not kept] + [kept]
    removed = []
    for entry in entries:
        if total <= max_bytes:
            break
        if entry is kept and not entry.derived:
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


def _stale_derived(entry: CacheEntry) -> bool:
    """Whether ``entry`` is derived and no process has used it since this one started."""
    return entry.derived and entry.last_used < PROCESS_START


def room_for_derived(root: str | os.PathLike[str], max_bytes: int | None, nbytes: int) -> bool:
    """Whether a derived entry of ``nbytes`` fits in the budget once the stale derived entries
    (none used since this process started) are evicted: a caller asks before it spends the time
    to make one that would only remove itself. Where it does not, says so at INFO level."""
    if max_bytes is None:
        return True
    kept = sum(e.size for e in cache_entries(root) if not _stale_derived(e))
    if kept + nbytes <= max_bytes:
        return True
    logger.info(
        "cache %s: no room in its %d-byte budget for a derived entry of %d bytes (a runtime's "
        "own form of an artifact never evicts an artifact); raise %s or clear old entries with "
        "`embedl-dynamo cache clear`", root, max_bytes, nbytes, ENV_CACHE_MAX_SIZE,
    )  # fmt: skip
    return False


def clear_cache(root: str | os.PathLike[str]) -> int:
    """Delete every file the store wrote under ``root``; returns the bytes freed.

    Only a directory holding the store's marker (:data:`~.files.CACHE_MARKER`, written with the
    first entry) is cleared, and in it only files named as the store names its entries,
    sidecars, locks and temporary files; directories left empty are removed. Anything else
    (another program's files, a link) is kept.

    Raises:
        NotACacheError: ``root`` exists but is not an embedl_dynamo cache.
    """
    root = Path(root)
    if not root.exists():
        return 0
    if not is_cache_root(root):
        raise NotACacheError(
            f"{root} is not an embedl_dynamo cache (it has no {CACHE_MARKER} marker), so "
            "nothing was deleted; point --cache-dir or EMBEDL_DYNAMO_CACHE_DIR at the cache"
        )
    freed = 0
    for path in sorted(root.glob("*/*/*")):
        if path.is_symlink() or not path.is_file() or not written_by_store(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            freed += size
    for directory in sorted(root.glob("*/*"), reverse=True) + sorted(root.glob("*")):
        if directory.is_dir() and not directory.is_symlink():
            with contextlib.suppress(OSError):
                directory.rmdir()  # only an empty directory goes
    return freed
