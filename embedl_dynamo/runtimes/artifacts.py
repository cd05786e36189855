"""Shared by the ONNX-based runtimes: the ONNX artifact's cache key and its cached export."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, fingerprint_graph, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.runtimes.onnx_export import DEFAULT_OPSET, export_onnx
from embedl_dynamo.settings import Settings

__all__ = [
    "BUILD_COUNTS",
    "cached_onnx",
    "code_fingerprint",
    "input_specs",
    "lookup_alias",
    "onnx_artifact",
    "store_alias",
]

logger = logging.getLogger(__name__)

# artifacts built (not loaded from the cache) by this process, per kind; tests read it
BUILD_COUNTS: dict[str, int] = {}
_lock = threading.Lock()


def count_build(kind: str) -> None:
    """Record that this process built one artifact of ``kind``."""
    with _lock:
        BUILD_COUNTS[kind] = BUILD_COUNTS.get(kind, 0) + 1


def input_specs(example_inputs: list[torch.Tensor], dynamic_batch: bool) -> list[Any]:
    """dtype and shape per input; dim 0 reads ``batch`` when the batch axis is dynamic."""
    first = next((t for t in example_inputs if t.dim() > 0), None)
    specs = []
    for t in example_inputs:
        shape: list[Any] = list(t.shape)
        if dynamic_batch and first is not None and t.dim() > 0 and t.shape[0] == first.shape[0]:
            shape[0] = "batch"
        specs.append({"dtype": str(t.dtype), "shape": shape})
    return specs


def onnx_artifact(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], settings: Settings
) -> tuple[Path, str, bool]:
    """The ONNX file for ``gm`` from the artifact cache, exported under the key's lock if absent.

    Returns:
        ``(path, key, built)``.
    """
    key = content_key(
        "onnx",
        fingerprint_graph(gm),
        input_specs(example_inputs, settings.dynamic_batch),
        {"dynamic_batch": settings.dynamic_batch, "opset": DEFAULT_OPSET},
        library_versions(),
    )
    cache = ArtifactCache(settings.cache_dir, "onnx")

    def _build(path: Path) -> None:
        # the TorchScript exporter only: torch.export inside a Dynamo backend upsets Dynamo state
        export_onnx(
            gm, example_inputs, path, dynamic_batch=settings.dynamic_batch, exporter="torchscript"
        )
        count_build("onnx")
        logger.info("built ONNX artifact %s", key[:16])

    path, built = cache.get_or_build(key, _build, ".onnx", meta={"kind": "onnx"})
    if not built:
        logger.info("reusing cached ONNX artifact %s", key[:16])
    return path, key, built


def cached_onnx(key: str, settings: Settings) -> Path | None:
    """The verified cached ONNX file for ``key``, or None."""
    return ArtifactCache(settings.cache_dir, "onnx").get(key, ".onnx")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 of this package's source: a transformation result depends on the code too."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


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
    return data if isinstance(data, dict) and isinstance(data.get("onnx_key"), str) else None


def store_alias(source_key: str, data: dict[str, Any], settings: Settings) -> None:
    """Record which artifact a subgraph (keyed before transformation) compiled to."""
    cache = ArtifactCache(settings.cache_dir, "subgraph")
    cache.put(source_key, json.dumps(data, sort_keys=True).encode(), ".json")
