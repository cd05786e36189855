"""Which ONNX artifact a Dynamo subgraph (keyed before any transformation) compiled to.

A warm start looks the subgraph up by its source key and skips the pipeline when the alias
names an artifact still in the cache, or says that eager beat the runtimes (no artifact).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from embedl_dynamo.cache.keys import is_content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.settings import Settings

__all__ = ["forget_alias", "lookup_alias", "store_alias"]

logger = logging.getLogger(__name__)


def lookup_alias(source_key: str, settings: Settings) -> dict[str, Any] | None:
    """What :func:`store_alias` recorded for a subgraph's source key (None if absent/corrupt)."""
    cache = ArtifactCache(settings.cache_dir, "subgraph")
    path = cache.get(source_key, ".json")
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    eager = isinstance(data, dict) and data.get("runtime") == EagerRuntime.name  # no artifact
    if not isinstance(data, dict) or not (eager or is_content_key(data.get("onnx_key"))):
        logger.warning("ignoring malformed subgraph alias %s; rebuilding", path.name)
        cache.remove(source_key, ".json")
        return None
    return data


def forget_alias(source_key: str, onnx_key: str, settings: Settings) -> None:
    """Remove an alias and the ONNX artifact it names: the artifact failed its check, so the
    rebuild must replace it rather than find it again."""
    ArtifactCache(settings.cache_dir, "subgraph").remove(source_key, ".json")
    ArtifactCache(settings.cache_dir, "onnx").remove(onnx_key, ".onnx")


def store_alias(source_key: str, data: dict[str, Any], settings: Settings) -> None:
    """Record which artifact a subgraph (keyed before transformation) compiled to.

    The alias only saves work: a cache that cannot be written skips it (logged at DEBUG).
    """
    cache = ArtifactCache(settings.cache_dir, "subgraph")
    try:
        cache.put(source_key, json.dumps(data, sort_keys=True).encode(), ".json")
    except OSError as exc:
        logger.debug("subgraph alias not stored: %s", exc)
