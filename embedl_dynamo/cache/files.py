"""The cache's files: where the cache lives, atomic writes, and writes on helper threads."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

from embedl_dynamo.errors import (
    CacheLockTimeoutError,
    ConfigurationError,
    NotACacheError,
    error_line,
)

__all__ = [
    "CACHE_MARKER",
    "DEFAULT_LOCK_TIMEOUT_S",
    "ENV_CACHE_DIR",
    "ENV_CACHE_LOCK_TIMEOUT",
    "ENV_CACHE_READ_ONLY",
    "atomic_move_in",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_without_cache",
    "claim_cache_root",
    "default_cache_dir",
    "env_flag",
    "exclusive_lock",
    "file_mode",
    "is_cache_root",
    "lock_timeout",
    "read_only_reason",
    "remove_tree",
    "tell_unstored",
    "run_in_background",
    "wait_for_cache_writes",
    "write_in_background",
]

ENV_CACHE_DIR = "EMBEDL_DYNAMO_CACHE_DIR"
ENV_CACHE_LOCK_TIMEOUT = "EMBEDL_DYNAMO_CACHE_LOCK_TIMEOUT"
#: how long a compile waits for another process's lock on a cache entry before it builds
#: without the cache (seconds)
DEFAULT_LOCK_TIMEOUT_S = 300.0
_LOCK_QUIET_S = 2.0  # a wait shorter than this (another process finishing a build) logs nothing
# written at a cache root by the store: only a root holding it is ever cleared
CACHE_MARKER = ".embedl_dynamo_cache"
_MARKER_TEXT = "This directory is an embedl_dynamo cache; `embedl-dynamo cache clear` empties it.\n"
T = TypeVar("T")
logger = logging.getLogger(__name__)

_WRITING: set[Future[Path]] = set()  # entries being written on helper threads
_WRITING_LOCK = threading.Lock()
_SCRATCH: list[Path] = []  # this process's directory of builds made without a cache
_SCRATCH_LOCK = threading.Lock()


def wait_for_cache_writes(timeout: float | None = None) -> None:
    """Wait until every cache entry this process is writing on a helper thread is stored.

    A compile runs its artifact from memory while the file is written, so it need not wait
    for a large file to reach the disk; call this before reading an artifact path from a
    report, or copying the cache. The interpreter waits for these writes at exit on its own.

    Raises:
        TimeoutError: ``timeout`` seconds passed first.

    Example:
        ```python
        torch.compile(model, backend="embedl_onnxruntime")(x)
        embedl_dynamo.wait_for_cache_writes()  # before copying the cache directory
        ```
    """
    with _WRITING_LOCK:
        pending = list(_WRITING)
    _, not_done = wait(pending, timeout=timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} cache entries still being written")


def run_in_background(work: Callable[[], T], name: str) -> Future[T]:
    """``work()`` on a helper thread (a ``ThreadPoolExecutor`` worker, which the interpreter
    waits for at exit); its future."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(work)
    finally:
        pool.shutdown(wait=False)  # the worker ends once ``work`` returns


def write_in_background(write: Callable[[], Path]) -> Future[Path]:
    """:func:`run_in_background` for a cache write: :func:`wait_for_cache_writes` waits on it."""
    writing = run_in_background(write, "embedl-cache-write")
    with _WRITING_LOCK:
        _WRITING.add(writing)
    writing.add_done_callback(_forget_write)
    return writing


def _forget_write(writing: Future[Path]) -> None:
    with _WRITING_LOCK:
        _WRITING.discard(writing)


def default_cache_dir() -> Path:
    """The cache root: ``$EMBEDL_DYNAMO_CACHE_DIR``, else ``$XDG_CACHE_HOME/embedl_dynamo``.

    Falls back to ``~/.cache/embedl_dynamo`` when ``XDG_CACHE_HOME`` is unset.
    """
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "embedl_dynamo"


def file_mode() -> int:
    """The mode a new file gets under the process umask (``0o666 & ~umask``), as ``open`` does."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, file_mode())  # mkstemp's 0600 would ignore the user's umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_move_in(src: Path, path: Path, before_replace: Callable[[Path], None]) -> None:
    """Move the finished file ``src`` to ``path`` atomically, running ``before_replace`` first.

    ``src`` is renamed (copied, from another filesystem) to a temporary name beside ``path``;
    ``before_replace(tmp)`` then runs on it (the cache writes the entry's checksum sidecar
    there, so a reader that finds the file always finds its checksum) before ``tmp`` replaces
    ``path``. On any failure the temporary file is removed.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        try:
            os.replace(src, tmp)
        except OSError:  # another filesystem
            shutil.copyfile(src, tmp)
        before_replace(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def claim_cache_root(root: Path) -> None:
    """Make ``root`` an embedl_dynamo cache before the store's first write into it: a missing
    or empty directory gets the marker (:data:`CACHE_MARKER`), one holding it is a cache
    already. A directory that holds other files is never adopted: ``cache clear`` empties a
    marked directory, so marking a user's folder would put its files in reach.

    Raises:
        NotACacheError: ``root`` holds files but no marker; the message names the fix.
    """
    root = Path(root)
    if is_cache_root(root):
        return
    root.mkdir(parents=True, exist_ok=True)
    others = sorted(name for name in os.listdir(root) if name != CACHE_MARKER)
    if others and is_cache_root(root):
        return  # another process or thread claimed it since the first look, and wrote in it
    if others:
        raise NotACacheError(
            f"cache directory {root} already holds files ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}) and no {CACHE_MARKER} marker, so it is not "
            "made a cache; point EMBEDL_DYNAMO_CACHE_DIR (or cache_dir, --cache-dir) at an "
            "empty or new directory, or at an existing embedl_dynamo cache"
        )
    try:
        with open(root / CACHE_MARKER, "x", encoding="utf-8") as f:  # not replaced: created once
            f.write(_MARKER_TEXT)
    except FileExistsError:  # another process claimed it first
        pass


def is_cache_root(root: Path) -> bool:
    """Whether ``root`` holds the marker the store writes (a regular file, not a link)."""
    marker = Path(root) / CACHE_MARKER
    return marker.is_file() and not marker.is_symlink()


def lock_timeout(env: Mapping[str, str] | None = None) -> float | None:
    """How long to wait for a cache entry's lock: ``$EMBEDL_DYNAMO_CACHE_LOCK_TIMEOUT``
    seconds (in ``env``, ``os.environ`` when None), else :data:`DEFAULT_LOCK_TIMEOUT_S`;
    None (``none``) waits as long as it takes.

    Raises:
        ConfigurationError: the value is not a number of seconds >= 0 or ``none``.
    """
    value = (os.environ if env is None else env).get(ENV_CACHE_LOCK_TIMEOUT)
    if value is None or not value.strip():
        return DEFAULT_LOCK_TIMEOUT_S
    if value.strip().lower() == "none":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ConfigurationError(
            f"invalid {ENV_CACHE_LOCK_TIMEOUT}={value!r}: the wait for another process's cache "
            "lock is a number of seconds >= 0 (e.g. '60'), or 'none' to wait without limit"
        )
    return seconds


def _acquire(f: Any, lock_path: Path, timeout: float | None) -> None:
    """``flock`` ``f`` exclusively, waiting at most ``timeout`` seconds (None: no limit); one
    warning once the wait passes :data:`_LOCK_QUIET_S`."""
    import fcntl

    if timeout is None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        return
    start, warned, pause = time.monotonic(), False, 0.01
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
        if waited >= timeout:
            raise CacheLockTimeoutError(
                f"{lock_path} was held by another process for {waited:.0f} s (limit "
                f"{timeout:g} s, {ENV_CACHE_LOCK_TIMEOUT})"
            )
        if not warned and waited >= min(_LOCK_QUIET_S, timeout / 2):
            warned = True
            logger.warning(
                "waiting for another process's lock on cache entry %s (up to %g s; set "
                "%s to change it)",
                lock_path,
                timeout,
                ENV_CACHE_LOCK_TIMEOUT,
            )
        time.sleep(min(pause, max(0.0, timeout - waited)))
        pause = min(pause * 2, 0.25)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``lock_path``, waiting while another process
    holds it: at most ``timeout`` seconds (None: as long as it takes).

    Raises:
        CacheLockTimeoutError: the lock was still held after ``timeout`` seconds.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as f:
        _acquire(f, lock_path, timeout)
        try:
            yield
        finally:
            # removed while still held: a process waiting on this file then finds the entry
            # built; a newcomer locks a fresh file (at worst two build, and put is atomic)
            with contextlib.suppress(OSError):
                lock_path.unlink()
            _release(f)


def _release(f: Any) -> None:
    import fcntl

    fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def remove_tree(path: Path) -> None:
    """Remove a directory tree, ignoring what is already gone."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def build_without_cache(name: str, start: Callable[[Path], Callable[[], None] | None]) -> Path:
    """Build the file ``name`` outside the cache (its directory is unusable): ``start(path)``
    writes it or returns the ``finish()`` that does; returns the path.

    Each such build gets a directory of its own under one temporary directory this process
    made, removed with all it holds when the interpreter exits (the artifacts are in use until
    then: OpenVINO maps its file), so builds without a cache leave nothing behind.

    Raises:
        RuntimeError: the builder wrote nothing.
    """
    with _SCRATCH_LOCK:
        if not _SCRATCH:
            _SCRATCH.append(Path(tempfile.mkdtemp(prefix="embedl_dynamo_uncached_")))
            atexit.register(shutil.rmtree, _SCRATCH[0], True)
    target = Path(tempfile.mkdtemp(dir=_SCRATCH[0])) / name
    finish = start(target)
    if finish is not None:
        finish()
    if not target.exists():
        raise RuntimeError(f"cache builder for {name} did not write {target}")
    return target


ENV_CACHE_READ_ONLY = "EMBEDL_DYNAMO_CACHE_READ_ONLY"
_YES = ("1", "true", "yes")
_NO = ("", "0", "false", "no")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """A yes/no environment variable ``name`` (in ``env``, ``os.environ`` when None): ``1``,
    ``true``, ``yes`` or ``0``, ``false``, ``no`` in any case; unset or empty is no.

    Raises:
        ConfigurationError: any other value (``on``, ``enabled``, a typo), naming the words
            accepted: a flag that is misspelt must not silently mean no.
    """
    value = (os.environ if env is None else env).get(name, "")
    word = value.strip().lower()
    if word not in _YES + _NO:
        raise ConfigurationError(
            f"invalid {name}={value!r}: expected {', '.join(_YES)} for yes or "
            f"{', '.join(_NO[1:])} for no (any case), or unset it"
        )
    return word in _YES


def read_only_reason(root: Path, env: Mapping[str, str] | None = None) -> str | None:
    """Why the cache at ``root`` must only be read (None: it may be written).

    A cache shipped to replicas (baked into an image, a volume mounted read-only) is used as
    it is: ``$EMBEDL_DYNAMO_CACHE_READ_ONLY=1`` says so explicitly (a process running as root
    can write where permissions say it cannot), and a read-only filesystem or a root this
    process may not write is detected.

    Raises:
        ConfigurationError: the variable holds no yes/no word (:func:`env_flag`).
    """
    if env_flag(ENV_CACHE_READ_ONLY, env):
        flag = (os.environ if env is None else env)[ENV_CACHE_READ_ONLY].strip()
        return f"${ENV_CACHE_READ_ONLY}={flag}"
    if not root.is_dir():
        return None  # created on the first write
    with contextlib.suppress(OSError):
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return "a read-only filesystem"
    if not os.access(root, os.W_OK):
        return "not writable by this process"
    return None


_TOLD_UNSTORED: set[str] = set()  # the kinds of derived entry a failure was told for


def tell_unstored(kind: str, cache_dir: str | os.PathLike[str], exc: BaseException) -> None:
    """Say once a process, as a warning, that a derived entry of ``kind`` (an optimised graph,
    a compiled model) could not be stored in ``cache_dir`` (a full disk, an unwritable cache):
    every later start then builds it again, which a user would otherwise see only as slow
    starts. Later failures of the kind are logged at debug level."""
    if kind in _TOLD_UNSTORED:
        logger.debug("%s not cached: %s", kind, exc)
        return
    _TOLD_UNSTORED.add(kind)
    logger.warning(
        "%s could not be stored in the cache %s (%s); later starts build it again. Free disk "
        "space there, or point EMBEDL_DYNAMO_CACHE_DIR elsewhere",
        kind,
        cache_dir,
        error_line(exc),
    )
