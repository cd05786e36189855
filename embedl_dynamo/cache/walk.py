"""The store's folders under a cache root, listed and emptied without following a link.

Eviction and ``cache clear`` delete files. A symbolic link in the cache (a namespace or key
folder pointing elsewhere, planted, or swapped in while they run) must never lead them outside
it: every folder is opened relative to its parent's descriptor with ``O_NOFOLLOW``, and files
are examined with ``lstat`` and removed relative to their folder's descriptor, as
``shutil.rmtree`` does on POSIX. The root is the directory the user named (through
``EMBEDL_DYNAMO_CACHE_DIR``, ``cache_dir`` or ``--cache-dir``; it may itself be a link to
another disk); nothing below it is followed, and a link found is named in one warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StoreFolder", "remove_empty_folders", "remove_files", "store_folders"]

logger = logging.getLogger(__name__)

# how ArtifactCache names its folders: <namespace>/<key[:2]>
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_BUCKET = re.compile(r"^[0-9a-f]{2}$")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SIDECAR_BYTES = 1 << 20


@dataclass(frozen=True)
class StoreFolder:
    """One ``<namespace>/<xx>`` folder, open: its regular files (``lstat``), read and removed
    through the folder's descriptor."""

    namespace: str
    path: Path
    fd: int
    files: dict[str, os.stat_result]

    def read_json(self, name: str) -> Any:
        """The JSON document in the regular file ``name`` (None: absent, a link, too large or
        not JSON)."""
        if name not in self.files or self.files[name].st_size > _MAX_SIDECAR_BYTES:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            try:
                return json.loads(f.read(_MAX_SIDECAR_BYTES + 1))
            except ValueError:
                return None

    def unlink(self, name: str) -> int:
        """Remove the regular file ``name`` (never a link or a folder); the bytes freed."""
        return _unlink(self.fd, name)


def _unlink(folder_fd: int, name: str) -> int:
    try:
        found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode):
            return 0
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        return 0
    return found.st_size


def _open_folder(name: str | os.PathLike[str], parent_fd: int | None) -> int | None:
    """A descriptor of the folder ``name`` (relative to ``parent_fd``), never through a link;
    None when it is missing, a link or not a folder."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent_fd)
    except OSError:
        return None


def _subfolders(fd: int, pattern: re.Pattern[str], where: Path, links: list[Path]) -> list[str]:
    """The names of the folders in ``fd`` that match ``pattern``; links go to ``links``."""
    names = []
    with os.scandir(fd) as found:
        for entry in found:
            if entry.is_symlink():
                links.append(where / entry.name)
            elif pattern.match(entry.name) and entry.is_dir(follow_symlinks=False):
                names.append(entry.name)
    return sorted(names)


def _files(fd: int, where: Path, links: list[Path]) -> dict[str, os.stat_result]:
    files = {}
    with os.scandir(fd) as found:
        for entry in found:
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    links.append(where / entry.name)
                elif stat.S_ISREG(info.st_mode):
                    files[entry.name] = info
    return files


def _root_fd(root: Path) -> int | None:
    try:  # the root the user named may be a link; nothing below it is followed
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def store_folders(root: str | os.PathLike[str]) -> Iterator[StoreFolder]:
    """Every ``<namespace>/<xx>`` folder under ``root``, opened without following a link; a
    folder is open while the caller handles it. Links met are named in one warning."""
    root = Path(root)
    root_fd = _root_fd(root)
    if root_fd is None:
        return
    links: list[Path] = []
    try:
        for namespace in _subfolders(root_fd, _NAMESPACE, root, links):
            ns_fd = _open_folder(namespace, root_fd)
            if ns_fd is None:
                continue
            try:
                for bucket in _subfolders(ns_fd, _BUCKET, root / namespace, links):
                    fd = _open_folder(bucket, ns_fd)
                    if fd is None:
                        continue
                    path = root / namespace / bucket
                    try:
                        yield StoreFolder(namespace, path, fd, _files(fd, path, links))
                    finally:
                        os.close(fd)
            finally:
                os.close(ns_fd)
    finally:
        os.close(root_fd)
        if links:
            named = ", ".join(str(p) for p in links[:3])
            message = "cache %s holds %d symbolic link(s), not followed, kept: %s"
            logger.warning(message, root, len(links), named)


def remove_files(root: Path, namespace: str, bucket: str, names: Iterable[str]) -> int:
    """Remove the regular files ``names`` of ``<root>/<namespace>/<bucket>``, reaching it
    without following a link below ``root``; the bytes freed."""
    root_fd = _root_fd(root)
    if root_fd is None:
        return 0
    ns_fd = bucket_fd = None
    try:
        ns_fd = _open_folder(namespace, root_fd)
        bucket_fd = _open_folder(bucket, ns_fd) if ns_fd is not None else None
        if bucket_fd is None:
            return 0
        return sum(_unlink(bucket_fd, name) for name in names)
    finally:
        for fd in (bucket_fd, ns_fd, root_fd):
            if fd is not None:
                os.close(fd)


def remove_empty_folders(root: str | os.PathLike[str]) -> None:
    """Remove the ``<namespace>/<xx>`` folders under ``root`` left empty, and the namespaces
    then empty (``rmdir`` never removes a link or a folder that holds anything)."""
    root_fd = _root_fd(Path(root))
    if root_fd is None:
        return
    try:
        for namespace in _subfolders(root_fd, _NAMESPACE, Path(root), []):
            ns_fd = _open_folder(namespace, root_fd)
            if ns_fd is None:
                continue
            try:
                for bucket in _subfolders(ns_fd, _BUCKET, Path(root), []):
                    with contextlib.suppress(OSError):
                        os.rmdir(bucket, dir_fd=ns_fd)
            finally:
                os.close(ns_fd)
            with contextlib.suppress(OSError):
                os.rmdir(namespace, dir_fd=root_fd)
    finally:
        os.close(root_fd)
