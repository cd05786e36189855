"""ONNX Runtime's optimised graph kept in the artifact cache, so that a warm start loads it.

Most of what an ONNX Runtime session costs to create over one of our files is its graph
optimisation: a weight-only file's ``DequantizeLinear`` -> ``MatMul`` pairs become
``MatMulNBits`` (their codes re-laid out), and the level-3 passes rewrite the layout. ONNX
Runtime can write the graph it optimised (``SessionOptions.optimized_model_filepath``, its
"offline mode") and run that file later with its optimisations off, the same kernels on the
same weights. This module keeps those files in this package's cache, so they follow the
cache's rules: content-keyed, written atomically with a checksum sidecar that is checked on
every read (while ONNX Runtime reads the file), kept within the size budget, and never written
in a read-only cache (a replica that ships one uses what it holds).

An entry is keyed by the digest the ONNX artifact is recorded with (so an artifact replaced by
other bytes under its key is never served the old file's graph), the session settings that shape the
optimised graph (:func:`~.session.graph_config`), the ONNX Runtime version and the CPU's name
and instruction-set flags: the level-3 passes write kernels for this CPU (ONNX Runtime warns
that such a file "should only be used in the same environment"). It is written on a helper
thread, one artifact at a time, so no start waits for it (:func:`store_in_background`): by a
compile whose session was built from a fresh export in memory, once the file is stored, and by
a start that found the artifact but no optimised graph (another CPU's cache, one evicted), once
the artifact's own checksum is confirmed; that start runs its session over the artifact
meanwhile. Only artifacts of this package's cache are kept (a file ``load()`` reads from
elsewhere is optimised as it is), and only from :data:`MIN_ARTIFACT_BYTES` (a small graph's
session is quick to make) up to :data:`MAX_ARTIFACT_BYTES`, since an entry holds the weights a
second time, and only where the cache's budget has room for it, evicting only derived entries
no process has used since this one started (:mod:`~embedl_dynamo.cache.budget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.companion import COMPANION_SUFFIX
from embedl_dynamo.cache.files import tell_unstored, write_in_background
from embedl_dynamo.cache.keys import content_key, cpu_identity, package_version
from embedl_dynamo.cache.store import DERIVED_FROM, ArtifactCache
from embedl_dynamo.errors import CorruptEntryError
from embedl_dynamo.onnx.external_data import file_bytes
from embedl_dynamo.runtimes.onnxruntime.session import (
    CPU_PROVIDER,
    create_session,
    graph_config,
    ort_log_severity,
)

__all__ = [
    "LOADED",
    "WRITING",
    "MAX_ARTIFACT_BYTES",
    "MIN_ARTIFACT_BYTES",
    "OPTIMIZED_GRAPH",
    "cpu_session",
    "store_in_background",
]

logger = logging.getLogger(__name__)

#: ONNX artifacts from this size up to the next keep their optimised graph in the cache
MIN_ARTIFACT_BYTES = 32 << 20
MAX_ARTIFACT_BYTES = 1 << 30
#: the ``build_info`` entry that says where a session's optimised graph came from
OPTIMIZED_GRAPH = "onnxruntime_optimized_graph"
#: its value when the session runs the optimised graph the cache held
LOADED = "loaded from the cache"
#: its value when the session runs the artifact and a helper thread writes the optimised graph
WRITING = "being written to the cache"
_NAMESPACE = "onnxruntime_optimized"
_FORMAT = 1
_SUFFIX = ".onnx"


def _options(optimized: bool) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = ort_log_severity()
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_DISABLE_ALL if optimized else level.ORT_ENABLE_ALL
    return options


def _entry(cache_dir: Path, artifact_digest: str) -> tuple[ArtifactCache | None, str]:
    """The cache (None when it cannot be opened) and the key of an optimised graph."""
    key = content_key(
        _NAMESPACE,
        _FORMAT,
        artifact_digest,
        graph_config(),
        package_version("onnxruntime", "onnxruntime-gpu"),
        cpu_identity(),
    )
    try:
        return ArtifactCache(cache_dir, _NAMESPACE), key
    except OSError:
        return None, key


def _loaded(cache: ArtifactCache, key: str, num_threads: int | None) -> Any:
    """A session over the optimised graph stored under ``key``, its checksum confirmed; None
    when there is none, or it is corrupt (removed, with a warning) or ONNX Runtime refuses it."""
    found = cache.get_verifying(key, _SUFFIX)  # hashed while ONNX Runtime reads it
    if found is None:
        return None
    path, confirm = found
    try:
        session = create_session(
            path, [CPU_PROVIDER], num_threads=num_threads, options=_options(optimized=True)
        )
    except Exception as exc:  # ONNX Runtime raises its own exception types
        logger.warning("optimised ONNX Runtime graph %s not used (%s); optimising again", path, exc)
        session = None
    try:
        confirm()
    except CorruptEntryError as exc:  # removed already
        logger.warning("%s; optimising the artifact again", exc)
        return None
    if session is None and not cache.read_only:  # intact, yet refused: made again
        cache.remove(key, _SUFFIX)
    return session


def _written(
    cache: ArtifactCache,
    key: str,
    artifact_and_digest: tuple[Path, str],
    artifact_problem: Callable[[], str | None] | None,
    num_threads: int | None,
) -> None:
    """Store the optimised graph of an artifact (its path and the digest it is recorded with)
    under ``key``: written by a session created for it (then let go), stored once
    ``artifact_problem()`` finds the artifact's checksum right (a corrupt artifact raises
    :class:`CorruptEntryError`: nothing is stored)."""
    artifact, digest = artifact_and_digest

    def build(tmp: Path) -> None:
        options = _options(optimized=False)
        options.optimized_model_filepath = str(tmp)
        for entry, value in (
            (
                "session.optimized_model_external_initializers_file_name",
                tmp.name + COMPANION_SUFFIX,
            ),
            ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
        ):
            options.add_session_config_entry(entry, value)
        create_session(artifact, [CPU_PROVIDER], num_threads=num_threads, options=options)
        problem = artifact_problem() if artifact_problem is not None else None
        if problem is not None:
            raise CorruptEntryError(f"ONNX artifact {artifact} is corrupt ({problem})")

    meta = {"kind": "onnxruntime optimized graph", "derived": True, DERIVED_FROM: digest}
    cache.get_or_build(key, build, _SUFFIX, meta=meta)


def _kept(cache: ArtifactCache, path: Path) -> bool:
    """Whether an artifact's optimised graph is kept: its size within the bounds, and room
    for about as much in the cache's budget."""
    size = file_bytes(path)
    return MIN_ARTIFACT_BYTES <= size <= MAX_ARTIFACT_BYTES and cache.room_for_derived(size)


_ONE_AT_A_TIME = threading.Lock()  # each background write holds a session's weights


def store_in_background(
    artifact: Callable[[], Path],
    artifact_digest: Callable[[], str | None],
    cache_dir: Path,
    num_threads: int | None,
    artifact_problem: Callable[[], str | None] | None = None,
) -> None:
    """Write the optimised graph of an artifact on a helper thread, one artifact at a time;
    :func:`~embedl_dynamo.cache.files.wait_for_cache_writes` waits for it.

    Args:
        artifact: gives the artifact's file (waits until it is written).
        artifact_digest: gives the digest it is recorded with (after that).
        cache_dir: the cache root.
        num_threads: the intra-op threads its sessions use.
        artifact_problem: waits for a cached artifact's checksum and returns the problem
            found (then nothing is stored), removing nothing; None for a file this process
            just wrote.
    """

    def store() -> Path:
        path = artifact()
        with _ONE_AT_A_TIME:
            digest = artifact_digest()
            cache, key = _entry(cache_dir, digest) if digest else (None, "")
            # room checked under the lock: a write queued before this one may have taken it
            if cache is None or cache.read_only or not _kept(cache, path):
                return path
            if cache.get(key, _SUFFIX) is None:
                _written(cache, key, (path, digest), artifact_problem, num_threads)
            return path

    def logged() -> Path:
        try:
            return store()
        except CorruptEntryError:  # the runtime refuses and removes the artifact itself
            raise
        except Exception as exc:  # the compile already has its session: a miss costs time only
            tell_unstored("ONNX Runtime's optimised graph", cache_dir, exc)
            raise

    write_in_background(logged)


def cpu_session(
    artifact: Callable[[], Path],
    artifact_problem: Callable[[], str | None] | None,
    artifact_digest: str | None,
    cache_dir: Path,
    num_threads: int | None,
    info: dict[str, Any],
) -> Any:
    """A CPU session over an ONNX artifact: over its optimised graph from the cache when there
    is one, else over the artifact itself, a helper thread writing that graph to the cache (see
    the module).

    Args:
        artifact: gives the artifact's file, for a caller about to read it (its own checksum
            starts then: it is not read, nor hashed, when the optimised graph is loaded).
        artifact_problem: waits for the artifact's checksum and returns the problem found,
            or None, without acting on it (the caller confirms the artifact itself); None: no
            checksum pending.
        artifact_digest: the digest it is recorded with in this package's cache (None: a file
            from elsewhere).
        cache_dir: the cache root.
        num_threads: intra-op threads.
        info: ``build_info``; gets :data:`OPTIMIZED_GRAPH` when the cache held or takes one.
    """
    cache, key = _entry(cache_dir, artifact_digest) if artifact_digest else (None, "")
    if cache is not None:  # an artifact too small or too large has no entry to find
        session = _loaded(cache, key, num_threads)
        if session is not None:
            info[OPTIMIZED_GRAPH] = LOADED
            return session
    path = artifact()
    session = create_session(path, [CPU_PROVIDER], num_threads=num_threads)
    if cache is not None and not cache.read_only and _kept(cache, path):
        store_in_background(
            lambda: path, lambda: artifact_digest, cache_dir, num_threads, artifact_problem
        )
        info[OPTIMIZED_GRAPH] = WRITING
    return session
