"""Builds the cache cannot take: made in this process's temporary directory, said once a root.

A cache directory that cannot be written (no space, no permission) or that must only be read
(shipped to replicas: :func:`~embedl_dynamo.cache.files.read_only_reason`) still lets a compile
build what it lacks; the file lives in a temporary directory removed at exit
(:func:`~embedl_dynamo.cache.files.build_without_cache`), and one warning per cache root says
why nothing is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from embedl_dynamo.cache.files import build_without_cache

__all__ = ["build_for_read_only", "build_for_unusable"]

logger = logging.getLogger(__name__)

_WARNED_UNUSABLE: set[str] = set()  # cache roots already reported unusable (warn once each)
_WARNED_READ_ONLY: set[str] = set()  # read-only roots already reported lacking an entry


def build_for_unusable(
    root: Path, reason: str, name: str, start: Callable[[Path], Callable[[], None] | None]
) -> Path:
    """Build ``name`` outside a cache directory that cannot be written (``reason``)."""
    if str(root) not in _WARNED_UNUSABLE:
        _WARNED_UNUSABLE.add(str(root))
        logger.warning(
            "cache directory %s is unusable (%s); compiling without a cache. Set "
            "EMBEDL_DYNAMO_CACHE_DIR or options={'cache_dir': ...} to a writable directory.",
            root,
            reason,
        )
    return build_without_cache(name, start)


def build_for_read_only(
    root: Path,
    reason: str | None,
    what: str,
    name: str,
    start: Callable[[Path], Callable[[], None] | None],
) -> Path:
    """Build ``name`` (``what``: namespace and key, for the message) that a read-only cache
    lacks, without storing it: a replica that builds was shipped an incomplete cache."""
    if str(root) not in _WARNED_READ_ONLY:
        _WARNED_READ_ONLY.add(str(root))
        logger.warning(
            "read-only cache %s (%s) lacks %s; building it without storing it. Build the "
            "cache for this model, inputs and settings where it is written (`embedl-dynamo "
            "deploy`), then ship it.",
            root,
            reason,
            what,
        )
    return build_without_cache(name, start)
