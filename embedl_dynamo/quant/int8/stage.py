"""The quantization stage on a fused graph: prepare -> annotate -> calibrate -> insert QDQ.

:func:`int8_stage` is the pipeline's stage of the precisions that quantize (``int8``, and
``mixed`` before its per-layer choice). :func:`quantize_graph` runs a target's :class:`~.quantizer.Quantizer` (SmoothQuant and
preparation rewrites, then placement), calibrates the chosen points (or reads their ranges from
the on-disk calibration cache) and inserts fake-quant nodes that export as Q/DQ.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.quant.int8.calibrate import (
    as_batches,
    calibrate,
    check_batches_finite,
    data_fingerprint,
    ranges_from_calibrators,
)
from embedl_dynamo.quant.int8.calibration_cache import calibration_key, load_ranges, store_ranges
from embedl_dynamo.quant.int8.insert import insert_fake_quant, insert_observers
from embedl_dynamo.quant.int8.placement import Placement
from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.spec import QuantizationConfig
from embedl_dynamo.settings import Settings

__all__ = [
    "QUANTIZATION_META",
    "CalibratedGraph",
    "calibrate_graph",
    "int8_stage",
    "quantize_graph",
]

#: ``gm.meta`` key of a quantized graph (INT8, FP8): the quantization report (its layers,
#: their ranges)
QUANTIZATION_META = "embedl_quantization"

logger = logging.getLogger(__name__)


@dataclass
class CalibratedGraph:
    """A prepared graph with its placement and calibrated ranges: any subset of its layers can
    be turned into a fake-quant graph without calibrating again (mixed precision needs many).

    Attributes:
        gm: the graph after the quantizer's preparation (SmoothQuant, rewrites).
        placement: where the target puts QDQ.
        config: the quantization config used.
        ranges: calibrated activation ranges, by node name.
        report: what :func:`quantize_graph` reports (without the per-build layer lists).
    """

    gm: fx.GraphModule
    placement: Placement
    config: QuantizationConfig
    ranges: dict[str, Any]
    report: dict[str, Any]

    def build(self, keep_float: Mapping[str, str] | None = None) -> tuple[fx.GraphModule, dict]:
        """The fake-quant graph with every placed layer INT8 except ``keep_float`` (id -> why).

        Returns:
            ``(fake-quant GraphModule, report)``; see :func:`quantize_graph`.
        """
        placement = self.placement
        for reason in sorted(set((keep_float or {}).values())):
            ids = {i for i, r in (keep_float or {}).items() if r == reason}
            placement = placement.without(ids, reason)
        quantized, weights = insert_fake_quant(self.gm, placement, self.config, self.ranges)
        for ident, reason in placement.float_layers:
            logger.debug("left in float: %s (%s)", ident, reason)
        report = {
            **self.report,
            "quantized_layers": placement.quantized_layers,
            "float_layers": [{"id": i, "reason": r} for i, r in placement.float_layers],
            "activation_count": len(placement.activations),
            "weight_count": len(placement.weights),
            "weights": weights,
        }
        quantized.meta[QUANTIZATION_META] = report
        return quantized, report


def int8_stage(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Any, settings: Settings
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The pipeline's stage of a precision that quantizes: calibrate, then insert Q/DQ.

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder; the one calibration batch when
            ``settings.calibration_data`` is None (``torch.compile`` calibrates lazily instead).
        backend: the target; its ``quantizer`` places the Q/DQ.
        settings: the calibration options (data, observer, cache, progress).

    Returns:
        ``(fake-quant graph, report entries)``: ``quantized``, ``quantization`` (see
        :func:`quantize_graph`) and ``quantize_s``.
    """
    start = time.perf_counter()
    data = settings.calibration_data
    if data is None:
        data = [tuple(t for t in example_inputs if isinstance(t, torch.Tensor))]
    model, report = quantize_graph(
        gm,
        backend.quantizer,
        data,
        observer=settings.observer,
        cache_dir=settings.cache_dir if settings.calibration_cache else None,
        use_cache=settings.calibration_cache,
        progress=settings.progress,
    )
    entries = {"quantized": True, "quantization": report}
    return model, {**entries, "quantize_s": round(time.perf_counter() - start, 4)}


def quantize_graph(
    gm: fx.GraphModule,
    quantizer: Quantizer,
    data: Iterable[Any] | Callable[[nn.Module], Any],
    **options: Any,
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """Quantize a fused, canonical graph with a target's ``quantizer``: every layer its
    placement rules choose is INT8.

    Args:
        gm: the graph after conversions and fusions (not modified).
        quantizer: the target's :class:`~.quantizer.Quantizer` (``Backend.quantizer``).
        data: calibration batches (tensors or tuples) or a callable ``forward_loop(model)``.
        options: as for :func:`calibrate_graph`.

    Returns:
        ``(fake-quant GraphModule, report)``; the report lists quantized layers, layers left in
        float and why, the ranges' source (``calibrated`` or ``cache``) and the scales.
    """
    quantized, report = calibrate_graph(gm, quantizer, data, **options).build()
    report.pop("weights", None)
    for item in report["float_layers"]:
        logger.info("left in float: %s (%s)", item["id"], item["reason"])
    return quantized, report


def calibrate_graph(
    gm: fx.GraphModule,
    quantizer: Quantizer,
    data: Iterable[Any] | Callable[[nn.Module], Any],
    *,
    observer: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    progress: bool | None = None,
) -> CalibratedGraph:
    """Prepare, annotate and calibrate ``gm`` for ``quantizer`` (ranges from the cache if kept).

    Args:
        gm: the graph after conversions and fusions (not modified).
        quantizer: the target's :class:`~.quantizer.Quantizer` (``Backend.quantizer``).
        data: calibration batches (tensors or tuples) or a callable ``forward_loop(model)``.
        observer: overrides the activation observer (``minmax``/``percentile``/``mse``/``entropy``).
        cache_dir: the cache root for calibrated ranges (None: no cache).
        use_cache: read and write the calibration cache.
        progress: tqdm bar over batches (None/True: only on a TTY).

    Returns:
        The :class:`CalibratedGraph`.
    """
    config = quantizer.config.with_observer(observer) if observer else quantizer.config
    is_loop = callable(data) and not isinstance(data, (list, tuple))
    batches = None if is_loop else as_batches(data)
    if batches is not None:
        check_batches_finite(batches)
    source = batches if batches is not None else data

    gm = copy.deepcopy(gm)
    prepared = quantizer.transform_for_annotation(gm, source)
    placement = quantizer.annotate(gm)
    quantizer.validate(gm, placement)

    caching = use_cache and cache_dir is not None
    # probing a forward_loop costs two forward passes: only worth it when the key is used
    fingerprint = data_fingerprint(source, gm if caching else None)
    if fingerprint is None and caching:
        logger.info("calibration data cannot be fingerprinted; its ranges are not cached")
        use_cache = False
    key = calibration_key(gm, config, placement, fingerprint or "uncached")
    ranges = None
    if use_cache and cache_dir is not None:
        ranges = load_ranges(cache_dir, key, placement, config)
    passes = 0
    origin = "cache" if ranges is not None else "calibrated"
    if ranges is None:
        observed, calibrators = insert_observers(gm, placement, config)
        passes = calibrate(observed, source, progress=True if progress is None else progress)
        ranges = ranges_from_calibrators(calibrators, placement, config)
    cache_path = None
    if use_cache and cache_dir is not None and origin == "calibrated":
        weights = insert_fake_quant(gm, placement, config, ranges)[1]  # frozen scales, to read
        try:
            cache_path = store_ranges(cache_dir, key, ranges, config, weights)
        except OSError as exc:  # the INT8 model is built all the same
            logger.warning("calibration ranges not cached (%s); they will be recomputed", exc)
    report = {
        "backend": quantizer.name,
        "config": config.to_dict(),
        "ranges_from": origin,
        "calibration_forward_passes": passes,
        "calibration_key": key,
        "calibration_cache_file": cache_path,
        "smoothed": prepared["smoothed"],
        "rewritten": prepared["rewritten"],
        "ranges": ranges,
    }
    return CalibratedGraph(gm, placement, config, ranges, report)
