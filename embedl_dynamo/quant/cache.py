"""The calibration cache: calibrated ranges on disk as readable JSON, keyed by content.

Key = sha256 of (graph fingerprint incl. weights, quantization config, placement, data
fingerprint, format version), so a second process with the same model and data finds the
ranges and runs no calibration pass, while other data or another config never reuses them.
Storage goes through :class:`embedl_dynamo.cache.store.ArtifactCache` (atomic writes, checksum
sidecars, path safety). An entry that is unreadable or does not cover the graph is logged as a
warning and recalibrated.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from torch import fx

from embedl_dynamo.cache.keys import content_key, fingerprint_graph
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.quant.placement import Placement
from embedl_dynamo.quant.spec import QuantizationConfig

__all__ = ["CALIBRATION_NAMESPACE", "calibration_key", "load_ranges", "store_ranges"]

logger = logging.getLogger(__name__)

CALIBRATION_NAMESPACE = "calibration"
_FORMAT = 1


def calibration_key(
    gm: fx.GraphModule, config: QuantizationConfig, placement: Placement, data_fingerprint: str
) -> str:
    """The cache key of one calibration (64 hex characters)."""
    return content_key(
        "calibration",
        _FORMAT,
        fingerprint_graph(gm),
        config.to_dict(),
        placement.to_dict()["activations"],
        data_fingerprint,
    )


def load_ranges(
    cache_dir: str | os.PathLike[str], key: str, placement: Placement
) -> dict[str, dict[str, Any]] | None:
    """The cached ranges for ``key``, or None (absent, or corrupt: warned and removed)."""
    cache = ArtifactCache(cache_dir, CALIBRATION_NAMESPACE)
    path = cache.get(key, ".json")
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        ranges = data["ranges"]
        missing = sorted(set(placement.activations) - set(ranges))
        if missing:
            raise ValueError(f"no range for {missing[:5]}")
        for name in placement.activations:
            float(ranges[name]["scale"])
            int(ranges[name]["zero_point"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("calibration cache entry %s is invalid (%s); recalibrating", path, exc)
        path.unlink(missing_ok=True)
        return None
    logger.info("calibration ranges loaded from %s", path)
    return ranges


def store_ranges(
    cache_dir: str | os.PathLike[str],
    key: str,
    ranges: dict[str, dict[str, Any]],
    config: QuantizationConfig,
    weights: dict[str, Any] | None = None,
) -> str:
    """Write ``ranges`` (and frozen weight scales, for reading) as JSON; returns the path."""
    cache = ArtifactCache(cache_dir, CALIBRATION_NAMESPACE)
    document = {
        "format": _FORMAT,
        "config": config.to_dict(),
        "ranges": ranges,
        "weights": weights or {},
    }
    text = json.dumps(document, indent=1, sort_keys=True)
    return str(cache.put(key, text.encode("utf-8"), ".json", meta={"kind": "calibration"}))
