"""Content-addressed on-disk cache for built artifacts (ONNX files, engines, calibration ranges).

An entry is found by a *key*: the sha256 of everything that decides its bytes (the graph's
structure and weights from :func:`fingerprint_graph`, the input specs, the settings and the
versions of torch / onnx / onnxruntime / tensorrt, joined by :func:`content_key`). Equal inputs
give equal keys, so a second process that compiles the same model finds the artifact and builds
nothing; anything that changes the artifact changes the key, so stale entries are never served.

Safety rules, all enforced here:

* writes are atomic (a temporary file, then ``os.replace``); the sidecar, with the artifact's
  digest (BLAKE3) and size, is synced before the artifact is moved in, and both are verified
  on every read: an entry that does not match (truncated, corrupted, half-written by a killed
  process) is logged as a warning, removed and rebuilt, never trusted; an artifact's companion
  (:mod:`.companion`) is moved in first, verified and removed with it; with a cache key
  (:mod:`.tags`) an entry without its valid tag is refused the same way;
* the store writes only into an empty or new directory, or one holding its marker
  (:func:`~embedl_dynamo.cache.files.claim_cache_root`), and follows no link below the root;
* keys must be lowercase hex and suffixes plain extensions, so no path escapes the cache root;
* a per-key ``fcntl.flock`` lock makes concurrent processes that build the same key wait for
  one builder (at most ``$EMBEDL_DYNAMO_CACHE_LOCK_TIMEOUT`` s, then build without the cache);
  its holder removes the lock file before release, so locks do not pile up;
* the whole root is kept within a size budget, least recently used entries evicted first
  (:mod:`embedl_dynamo.cache.budget`: 5 GB unless ``$EMBEDL_DYNAMO_CACHE_MAX_SIZE`` says otherwise);
* only bytes and JSON are stored: no pickle;
* a read-only cache (:func:`~embedl_dynamo.cache.files.read_only_reason`: shipped to replicas)
  is never written: a bad entry is ignored, what it lacks built in a temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from embedl_dynamo.cache.budget import evict_to_budget, max_cache_bytes, room_for_derived
from embedl_dynamo.cache.checksums import (
    PendingChecksum,
    hash_problem,
    recorded_digest,
    sidecar_path,
    sidecar_problem,
    write_sidecar,
)
from embedl_dynamo.cache.companion import COMPANION_SUFFIX, companion_path, move_companion
from embedl_dynamo.cache.digests import DIGEST, blake3_digest, file_digest
from embedl_dynamo.cache.files import (
    atomic_move_in,
    atomic_write_bytes,
    build_without_cache,
    claim_cache_root,
    default_cache_dir,
    exclusive_lock,
    lock_timeout,
    read_only_reason,
    remove_tree,
    write_in_background,
)
from embedl_dynamo.cache.hashed_file import written_digest
from embedl_dynamo.cache.keys import is_content_key
from embedl_dynamo.cache.scratch_builds import build_for_read_only, build_for_unusable
from embedl_dynamo.cache.tags import UNTAGGED, tell_untagged
from embedl_dynamo.cache.walk import remove_files
from embedl_dynamo.errors import CacheLockTimeoutError, CorruptEntryError, ReadOnlyCacheError

T = TypeVar("T")

__all__ = ["DERIVED_FROM", "ArtifactCache"]

#: the key, in a derived entry's metadata, of the BLAKE3 digest of the artifact it was made
#: from (OpenVINO's compiled model, ONNX Runtime's optimised graph): a bundle ships it beside
#: that artifact
DERIVED_FROM = "derived_from"

logger = logging.getLogger(__name__)

_SUFFIX = re.compile(r"^(\.[A-Za-z0-9_]{1,16}){0,3}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class ArtifactCache:
    """One namespace (``onnx``, ``calibration``, ``trt_engine``...) of the on-disk cache.

    Entries live at ``<root>/<namespace>/<key[:2]>/<key><suffix>`` with a sidecar
    ``<key><suffix>.meta.json`` holding its digest (``blake3``), ``size`` and caller metadata.

    Args:
        root: the cache root (:func:`default_cache_dir` when None).
        namespace: a plain directory name.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, namespace: str = "artifacts"):
        if not _NAMESPACE.match(namespace):
            raise ValueError(
                f"invalid cache namespace {namespace!r}: use letters, digits, '_', '-', '.'"
            )
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.namespace = namespace
        self.dir = self.root.resolve() / namespace  # the root may be a link; nothing below it
        link = self.dir.is_symlink()  # why the directory cannot be written, once found:
        self._unusable = f"{self.dir} is a symbolic link, never followed" if link else None
        self.read_only = read_only_reason(self.root)  # why it is only read (None: written)

    def __repr__(self) -> str:
        return f"ArtifactCache({str(self.root)!r}, {self.namespace!r})"

    def path(self, key: str, suffix: str = "") -> Path:
        """Where the artifact for ``key`` lives; refuses keys or suffixes that could escape.

        Raises:
            ValueError: ``key`` is not 16-128 lowercase hex characters, or ``suffix`` is not a
                plain extension such as ``.onnx`` or ``.ort.onnx``.
        """
        if not is_content_key(key):
            raise ValueError(
                f"invalid cache key {key!r}: keys are 16-128 lowercase hex characters "
                "(use content_key() or fingerprint_graph())"
            )
        if not _SUFFIX.match(suffix):
            raise ValueError(f"invalid cache suffix {suffix!r}: expected e.g. '.onnx' or '.json'")
        # the regexes forbid separators; get() refuses a planted link instead of following it
        return self.dir / key[:2] / f"{key}{suffix}"

    def _remove(self, path: Path) -> None:
        if self.read_only:
            return  # a shipped cache is never changed: the entry is ignored, not removed
        names = [path.name, path.name + COMPANION_SUFFIX, sidecar_path(path).name]
        remove_files(self.dir.parent, self.namespace, path.parent.name, names)  # no link followed

    def remove(self, key: str, suffix: str = "") -> None:
        """Delete the entry for ``key`` (a bad artifact must be replaced, not reused)."""
        self._remove(self.path(key, suffix))

    def get(self, key: str, suffix: str = "") -> Path | None:
        """The verified artifact path for ``key``, or None if absent or corrupt.

        A corrupt entry (sidecar missing or unreadable, size or checksum mismatch) is logged as a
        warning and removed, so the caller rebuilds it.
        """
        path = self._find(key, suffix)
        if path is None:
            return None
        problem, record = sidecar_problem(path)
        problem = problem or hash_problem(path, record)
        if problem is None:
            return self._used(path)
        self._report_corrupt(path, problem)
        return None

    def _report_corrupt(self, path: Path, problem: str) -> None:
        """Warn of a corrupt entry and remove it (in a read-only cache: ignore it); entries
        refused for their tag are told once per cache root."""
        if problem.startswith(UNTAGGED):
            tell_untagged(self.root, path, problem, bool(self.read_only))
        else:
            then = "ignoring it (read-only cache)" if self.read_only else "removing it, rebuilding"
            logger.warning("cache entry %s is corrupt (%s); %s", path, problem, then)
        self._remove(path)

    def get_verifying(
        self, key: str, suffix: str = "", start: bool = True
    ) -> tuple[Path, PendingChecksum] | None:
        """Like :meth:`get`, but the digest is computed on a helper thread while the caller
        starts reading the file (say, an ONNX Runtime session over it): hashing and reading
        overlap instead of running one after the other.

        Args:
            key: the content key.
            suffix: the file extension.
            start: start hashing now; when False, :meth:`PendingChecksum.start` does (a caller
                that may never read the file: it then never hashes it).

        Returns:
            None as :meth:`get` would, else ``(path, confirm)``: the caller must call
            ``confirm()`` before trusting what it read. It raises :class:`CorruptEntryError`
            (the entry already removed) when the bytes do not match their sidecar.
        """
        path = self._find(key, suffix)
        if path is None:
            return None
        problem, record = sidecar_problem(path)
        if problem is not None:
            self._report_corrupt(path, problem)
            return None

        def corrupt(problem: str) -> None:
            self._remove(path)  # by the caller, once it is done reading it
            raise CorruptEntryError(f"cache entry {path} is corrupt ({problem})")

        pending = PendingChecksum(lambda: hash_problem(path, record), corrupt)
        if start:
            pending.start()
        return self._used(path), pending

    def _find(self, key: str, suffix: str) -> Path | None:
        """The entry's file, None when absent; symbolic links (to it, its directory, companion or
        sidecar) are removed."""
        path = self.path(key, suffix)
        meta_path = sidecar_path(path)
        if self._unusable is not None:
            return None
        links = [p for p in (path.parent, path, companion_path(path), meta_path) if p.is_symlink()]
        if links:
            logger.warning("cache entry %s is a symbolic link; not following it", links[0])
            for link in links if not self.read_only else ():
                link.unlink()
            return None
        if not path.exists():  # absent, or a sidecar whose file is being stored right now
            return None
        return path

    def _used(self, path: Path) -> Path:
        if not self.read_only:
            with contextlib.suppress(OSError):
                os.utime(path)  # its last use, for least-recently-used eviction
        return path

    def get_json(self, key: str, read: Callable[[Any], T], what: str, then: str) -> T | None:
        """``read(document)`` of the verified JSON entry for ``key``, or None if absent.

        ``read`` raises ``ValueError``, ``KeyError`` or ``TypeError`` on content it does not
        trust; such an entry (or one that is not JSON) is logged as a warning naming ``what``
        and ``then`` (what happens instead) and removed, so the caller rebuilds it.
        """
        path = self.get(key, ".json")
        if path is None:
            return None
        try:
            return read(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("%s %s is invalid (%s); %s", what, path, exc, then)
            self.remove(key, ".json")
            return None

    def metadata(self, key: str, suffix: str = "") -> dict[str, Any]:
        """The caller metadata stored with an entry by :meth:`put` (empty if none)."""
        meta_path = sidecar_path(self.path(key, suffix))
        try:
            return dict(json.loads(meta_path.read_text()).get("meta", {}))
        except (OSError, ValueError):
            return {}

    def recorded_digest(self, key: str, suffix: str = "") -> str | None:
        """The digest the entry's sidecar records (:func:`~.checksums.recorded_digest`): what a
        file derived from the entry is keyed by. None when absent or unreadable."""
        return recorded_digest(self.path(key, suffix))

    def put(
        self,
        key: str,
        data: bytes | str | os.PathLike[str],
        suffix: str = "",
        meta: dict[str, Any] | None = None,
    ) -> Path:
        """Store an artifact atomically and return its path.

        Args:
            key: the content key.
            data: the bytes, or the path of a finished file to move in (same filesystem is
                cheapest; it is copied otherwise). A file written with
                :func:`~embedl_dynamo.cache.hashed_file.open_hashed` is not read again to hash.
            suffix: the file extension.
            meta: JSON-serialisable metadata kept in the sidecar.

        Raises:
            ReadOnlyCacheError: the cache is only read (:attr:`read_only`).
        """
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cache {self.root} is read-only ({self.read_only}); {key[:16]} not stored"
            )
        path = self.path(key, suffix)
        claim_cache_root(self.root)
        path.parent.mkdir(parents=True, exist_ok=True)
        companion = None

        def record(digest: str, size: int) -> None:
            # the sidecar goes first: a reader that finds the file always finds its checksum
            record = {DIGEST: digest, "size": size, "meta": meta or {}}
            write_sidecar(path, {**record, **({"companion": companion} if companion else {})})

        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            record(blake3_digest(data).hex(), len(data))
            atomic_write_bytes(path, data)
        else:
            src = Path(data)
            digest = written_digest(src)
            companion = move_companion(src, path)
            atomic_move_in(
                src, path, lambda tmp: record(digest or file_digest(tmp), tmp.stat().st_size)
            )
        evict_to_budget(self.dir.parent, max_cache_bytes(), keep=path)
        return path

    def room_for_derived(self, nbytes: int) -> bool:
        """Whether a derived entry (``meta={"derived": True}``: a runtime's own form of an
        artifact) of about ``nbytes`` fits in the cache's budget, evicting only derived entries
        no process has used since this one started (:func:`~.budget.room_for_derived`)."""
        return room_for_derived(self.root, max_cache_bytes(), nbytes)

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Hold an exclusive per-key file lock (:func:`exclusive_lock`, :func:`lock_timeout`)."""
        return exclusive_lock(self.path(key, ".lock"), lock_timeout())

    def get_or_start(
        self,
        key: str,
        start: Callable[[Path], Callable[[], None] | None],
        suffix: str = "",
        meta: dict[str, Any] | None = None,
    ) -> tuple[Path, bool, Future[Path] | None]:
        """:meth:`get_or_build` for a builder that can hand the slow part of writing to a
        helper thread.

        ``start(tmp)`` runs under the key's lock like a builder; it writes ``tmp`` itself and
        returns None, or returns ``finish``, which writes it on a helper thread (not a daemon:
        the interpreter waits for it at exit) while the caller goes on with what ``start``
        kept in memory. The entry is stored and the lock released when ``finish`` returns, so
        other processes wait for the finished file, never read half of it. A ``finish`` that
        fails stores nothing (a warning says why) and the next compile builds again.

        Returns:
            ``(path, built, writing)``: ``writing`` is None when ``path`` exists now, else
            a future that resolves to ``path`` once it is stored (or holds the error).
        """
        found = self.get(key, suffix)
        if found is not None:
            return found, False, None
        if self.read_only:
            path = build_for_read_only(
                self.root, self.read_only, f"{self.namespace} {key[:16]}", f"{key}{suffix}", start
            )
            return path, True, None
        try:
            if self._unusable is None:
                claim_cache_root(self.root)  # NotACacheError: a user's folder is not adopted
                self.path(key, suffix).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._unusable = f"{type(exc).__name__}: {exc.strerror or exc}"
        if self._unusable is not None:
            return build_for_unusable(self.root, self._unusable, key + suffix, start), True, None
        held = contextlib.ExitStack()
        try:
            held.enter_context(self.lock(key))
        except CacheLockTimeoutError as exc:
            logger.warning("%s; building without the cache", exc)
            return build_without_cache(f"{key}{suffix}", start), True, None
        try:
            found = self.get(key, suffix)  # another process may have built it meanwhile
            if found is not None:
                held.close()
                return found, False, None
            final = self.path(key, suffix)
            tmp_dir = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=final.parent))
            held.callback(remove_tree, tmp_dir)
            tmp = tmp_dir / final.name  # a companion is named after it (model.onnx.data)
            finish = start(tmp)
            if finish is None:
                with held:
                    return self._store_built(key, tmp, suffix, meta), True, None
        except BaseException:
            held.close()
            raise

        def write() -> Path:
            try:
                with held:
                    finish()
                    return self._store_built(key, tmp, suffix, meta)
            except BaseException as exc:
                logger.warning(
                    "cache entry %s not stored (%s); it is built again next time", final, exc
                )
                raise

        return final, True, write_in_background(write)

    def _store_built(self, key: str, tmp: Path, suffix: str, meta: dict[str, Any] | None) -> Path:
        if not tmp.exists():
            raise RuntimeError(f"cache builder for {key} did not write {tmp}")
        return self.put(key, tmp, suffix, meta)

    def get_or_build(
        self,
        key: str,
        build: Callable[[Path], None],
        suffix: str = "",
        meta: dict[str, Any] | None = None,
    ) -> tuple[Path, bool]:
        """Return the artifact for ``key``, building it under the key's lock if needed.

        Args:
            key: the content key.
            build: writes the artifact to the path it is given (a temporary path beside the
                final one); it runs only when no valid entry exists.
            suffix: the file extension.
            meta: metadata for the sidecar.

        Returns:
            ``(path, built)``: ``built`` is False when the entry came from the cache.
        """

        def start(path: Path) -> None:
            build(path)  # writes it all here: nothing left for a helper thread

        path, built, _ = self.get_or_start(key, start, suffix, meta)
        return path, built
