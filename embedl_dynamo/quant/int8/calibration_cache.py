"""The calibration cache: calibrated ranges on disk as readable JSON, keyed by content.

Key = sha256 of (graph fingerprint incl. weights, quantization config, placement, data
fingerprint, format version), so a second process with the same model and data finds the
ranges and runs no calibration pass, while other data or another config never reuses them.
Storage goes through :class:`embedl_dynamo.cache.store.ArtifactCache` (atomic writes, checksum
sidecars, path safety). An entry that is unreadable or does not cover the graph is logged as a
warning and recalibrated.

The sidecar only proves the file is what was written, not that it was written by us: anyone who
edits the JSON can re-sign it. So every range is checked against the observer statistics stored
beside it: ``min``/``max`` finite, ordered and within :data:`MAX_ABS_RANGE`, the dtype the config
asks for, and ``scale``/``zero_point`` exactly what :func:`scale_zero_point` derives from them.
A scale edited on its own, or a range blown up to make a layer useless, is recalibrated.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from torch import fx

from embedl_dynamo.cache.keys import content_key, fingerprint_graph
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.quant.int8.observers import scale_zero_point
from embedl_dynamo.quant.int8.placement import Placement
from embedl_dynamo.quant.int8.spec import QuantizationConfig
from embedl_dynamo.rewrite.qdq import Role

__all__ = [
    "CALIBRATION_NAMESPACE",
    "MAX_ABS_RANGE",
    "calibration_key",
    "load_ranges",
    "store_ranges",
]

logger = logging.getLogger(__name__)

CALIBRATION_NAMESPACE = "calibration"
_FORMAT = 1
MAX_ABS_RANGE = 1e6  # activations beyond this are not an 8-bit range anyone calibrated


def _check_range(name: str, entry: dict[str, Any], config: QuantizationConfig, role: Role) -> None:
    """Raise ValueError unless ``entry`` is what calibration derives from its min/max."""
    spec = config.spec(role)
    if spec is None:
        raise ValueError(f"{name}: the config quantizes no {role.value}")
    lo, hi, scale = float(entry["min"]), float(entry["max"]), float(entry["scale"])
    spec = spec.for_range(lo)
    zero_point = int(entry["zero_point"])
    if not all(math.isfinite(v) for v in (lo, hi, scale)) or not lo <= hi:
        raise ValueError(f"{name}: range [{lo}, {hi}] scale {scale} is not finite and ordered")
    if max(abs(lo), abs(hi)) > MAX_ABS_RANGE:
        raise ValueError(f"{name}: range [{lo}, {hi}] exceeds +-{MAX_ABS_RANGE:g}")
    if entry.get("dtype") != spec.dtype:
        raise ValueError(f"{name}: dtype {entry.get('dtype')!r}, the config asks {spec.dtype!r}")
    expected_scale, expected_zp = scale_zero_point(spec, lo, hi)
    if not math.isclose(scale, float(expected_scale), rel_tol=1e-6) or zero_point != int(
        expected_zp
    ):
        raise ValueError(
            f"{name}: scale {scale} / zero point {zero_point} do not follow from its range "
            f"[{lo}, {hi}] (expected {float(expected_scale)} / {int(expected_zp)})"
        )


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
    cache_dir: str | os.PathLike[str],
    key: str,
    placement: Placement,
    config: QuantizationConfig,
) -> dict[str, dict[str, Any]] | None:
    """The cached ranges for ``key``, or None (absent, corrupt or inconsistent: warned, removed)."""

    def read(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
        ranges = document["ranges"]
        missing = sorted(set(placement.activations) - set(ranges))
        if missing:
            raise ValueError(f"no range for {missing[:5]}")
        for name, role in placement.activations.items():
            _check_range(name, ranges[name], config, role)
        return ranges

    cache = ArtifactCache(cache_dir, CALIBRATION_NAMESPACE)
    ranges = cache.get_json(key, read, "calibration cache entry", "recalibrating")
    if ranges is not None:
        logger.info("calibration ranges loaded from the cache (%s)", key[:16])
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
