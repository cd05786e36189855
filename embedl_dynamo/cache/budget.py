"""The cache's size budget: usage per namespace, least-recently-used eviction, clearing.

Every entry is an artifact plus its ``.meta.json`` sidecar (see :mod:`embedl_dynamo.cache.store`);
a file without a sidecar the store wrote is not an entry, and is never counted or deleted.
Folders are walked without following a symbolic link (:mod:`embedl_dynamo.cache.walk`).
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

import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.companion import COMPANION_SUFFIX
from embedl_dynamo.cache.digests import DIGEST
from embedl_dynamo.cache.files import CACHE_MARKER, is_cache_root
from embedl_dynamo.cache.walk import (
    StoreFolder,
    remove_empty_folders,
    remove_files,
    store_folders,
)
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
# how ArtifactCache names what it writes in <namespace>/<key[:2]>/: <key><suffix>, a sidecar
# <key><suffix>.meta.json, a lock <key>.lock (empty) and temporary files .<name>.<random>.tmp
_ENTRY = re.compile(r"^(?P<key>[0-9a-f]{16,128})(\.[A-Za-z0-9_]{1,16}){0,5}$")
_LOCK = re.compile(r"^(?P<key>[0-9a-f]{16,128})\.lock$")
_TEMPORARY = re.compile(r"^\.(?P<key>[0-9a-f]{16,128})[A-Za-z0-9_.]*\.[a-z0-9_]{8}\.tmp$")


@dataclass(frozen=True)
class CacheEntry:
    """One stored artifact: where it is, its bytes with the sidecar, and its last use."""

    namespace: str
    path: Path
    size: int
    last_used: float
    derived: bool = False
    companion: bool = False  # its sidecar records a companion (``<name>.data``)

    def remove(self) -> None:
        """Delete the artifact, its sidecar and its companion, never through a link."""
        names = [self.path.name, self.path.name + _META]
        names += [self.path.name + COMPANION_SUFFIX] if self.companion else []
        remove_files(self.path.parents[2], self.namespace, self.path.parent.name, names)


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


def _ours(folder: StoreFolder, name: str) -> bool:
    """Whether ``name`` in ``folder`` is named as the store names an entry there."""
    entry = _ENTRY.match(name)
    return bool(entry and entry.group("key")[:2] == folder.path.name)


def _record(folder: StoreFolder, sidecar: str) -> dict[str, Any] | None:
    """The sidecar's record when it is one the store wrote (a digest and a size), else None."""
    record = folder.read_json(sidecar)
    if isinstance(record, dict) and DIGEST in record and "size" in record:
        return record
    return None


def _folder_entries(folder: StoreFolder) -> list[CacheEntry]:
    """The complete entries of ``folder``: an artifact with a sidecar the store wrote."""
    entries = []
    for sidecar in sorted(n for n in folder.files if n.endswith(_META)):
        name = sidecar[: -len(_META)]
        record = _record(folder, sidecar) if _ours(folder, name) else None
        if record is None or name not in folder.files:
            continue
        companion = record.get("companion") is not None
        size = folder.files[name].st_size + folder.files[sidecar].st_size
        if companion and name + COMPANION_SUFFIX in folder.files:
            size += folder.files[name + COMPANION_SUFFIX].st_size
        meta = record.get("meta")
        derived = isinstance(meta, dict) and bool(meta.get("derived", False))
        used = folder.files[name].st_mtime
        entry = CacheEntry(folder.namespace, folder.path / name, size, used, derived, companion)
        entries.append(entry)
    return entries


def cache_entries(root: str | os.PathLike[str]) -> list[CacheEntry]:
    """Every complete entry under ``root``: ``<namespace>/<xx>/<key><suffix>`` with a sidecar
    the store wrote, found without following a link."""
    return [e for folder in store_folders(root) for e in _folder_entries(folder)]


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
            root,
            max_bytes,
            len(removed),
        )
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
        "`embedl-dynamo cache clear`",
        root,
        max_bytes,
        nbytes,
        ENV_CACHE_MAX_SIZE,
    )
    return False


def clear_cache(root: str | os.PathLike[str]) -> int:
    """Delete every file the store can prove it wrote under ``root``; returns the bytes freed.

    Only a directory holding the store's marker (:data:`~.files.CACHE_MARKER`, written when the
    store first writes to an empty or new directory) is cleared, and in it only entries whose
    sidecar the store wrote (artifact, sidecar, the companion the sidecar records), a sidecar
    whose artifact is gone, empty lock files and the store's temporary files, each named as the
    store names them; folders left empty are removed. Anything else (another program's files,
    an entry-shaped file without a sidecar) is kept, and no link is followed.

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
    for folder in store_folders(root):
        freed += sum(folder.unlink(name) for name in _written(folder))
    remove_empty_folders(root)
    return freed


def _written(folder: StoreFolder) -> list[str]:
    """The files of ``folder`` the store can prove it wrote (see :func:`clear_cache`)."""
    names = []
    for entry in _folder_entries(folder):
        names += [entry.path.name, entry.path.name + _META]
        names += [entry.path.name + COMPANION_SUFFIX] if entry.companion else []
    for name, info in folder.files.items():
        lock, temporary = _LOCK.match(name), _TEMPORARY.match(name)
        found = lock or temporary
        if found and found.group("key")[:2] == folder.path.name:
            names += [name] if temporary or info.st_size == 0 else []
        elif name.endswith(_META) and _ours(folder, name[: -len(_META)]):
            names += [name] if _record(folder, name) is not None else []  # artifact gone
    return list(dict.fromkeys(names))
