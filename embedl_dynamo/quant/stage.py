"""The quantization stage: smooth -> quantization rewrites -> placement -> calibration -> QDQ.

:func:`quantize_graph` is the stage itself, on a fused graph; :func:`quantize_for_pipeline` is
the hook ``pipeline.run_pipeline`` calls with the compile settings; :func:`quantize` is the
public entry point on a plain module (it runs the Backend's conversions and fusions first) and
returns the fake-quant model for inspection, export or QAT.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.quant.cache import calibration_key, load_ranges, store_ranges
from embedl_dynamo.quant.calibrate import (
    as_batches,
    calibrate,
    check_batches_finite,
    data_fingerprint,
    ranges_from_calibrators,
)
from embedl_dynamo.quant.insert import insert_fake_quant, insert_observers
from embedl_dynamo.quant.placement import apply_quantized_rewrites, plan_placement
from embedl_dynamo.quant.smooth import apply_smoothing
from embedl_dynamo.quant.spec import QuantizationConfig
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["quantize", "quantize_for_pipeline", "quantize_graph", "resolve_backend"]

logger = logging.getLogger(__name__)


def resolve_backend(backend: Any) -> Any:
    """A Backend from an instance, a name, or None (the active backend)."""
    from embedl_dynamo.backend import Backend, backend_by_name, get_backend

    if backend is None:
        backend = get_backend()
    elif isinstance(backend, str):
        backend = backend_by_name(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"expected a Backend or a backend name, got {backend!r}")
    return backend


def _config_for(backend: Any, config: QuantizationConfig | None, observer: str | None):
    config = config if config is not None else backend.quantization
    if config is None:
        from embedl_dynamo.backend import discover_backends

        with_int8 = sorted(n for n, b in discover_backends().items() if b.quantization is not None)
        raise ValueError(
            f"backend {backend.name!r} has no INT8 quantization config; pass config=... or use "
            f"one of: {with_int8}"
        )
    if not isinstance(config, QuantizationConfig):
        raise TypeError(f"config must be a QuantizationConfig, got {type(config).__name__}")
    return config.with_observer(observer) if observer else config


def quantize_graph(
    gm: fx.GraphModule,
    backend: Any,
    data: Iterable[Any] | Callable[[nn.Module], Any],
    *,
    config: QuantizationConfig | None = None,
    observer: str | None = None,
    cache_dir: Any = None,
    use_cache: bool = True,
    progress: bool | None = None,
    smooth_patterns: Sequence[Pattern] | None = None,
    quantized_patterns: Sequence[Pattern] | None = None,
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """Quantize a fused, canonical graph for ``backend``.

    Args:
        gm: the graph after conversions and fusions (not modified).
        backend: a Backend, its name, or None for the active one.
        data: calibration batches (tensors or tuples) or a callable ``forward_loop(model)``.
        config: overrides ``backend.quantization``.
        observer: overrides the activation observer (``minmax``/``percentile``/``mse``/``entropy``).
        cache_dir: the cache root for calibrated ranges (None: no cache).
        use_cache: read and write the calibration cache.
        progress: tqdm bar over batches (None/True: only on a TTY).
        smooth_patterns, quantized_patterns: override the backend's lists.

    Returns:
        ``(fake-quant GraphModule, report)``; the report lists quantized layers, layers left in
        float and why, the ranges' source (``calibrated`` or ``cache``) and the scales.
    """
    backend = resolve_backend(backend)
    config = _config_for(backend, config, observer)
    smooth = backend.smooth_patterns if smooth_patterns is None else smooth_patterns
    placing = backend.quantized_patterns if quantized_patterns is None else quantized_patterns
    is_loop = callable(data) and not isinstance(data, (list, tuple))
    batches = None if is_loop else as_batches(data)
    if batches is not None:
        check_batches_finite(batches)
    source = batches if batches is not None else data

    gm = copy.deepcopy(gm)
    smoothed = apply_smoothing(gm, smooth, source) if smooth else []
    rewritten = apply_quantized_rewrites(gm, placing)
    placement = plan_placement(gm, placing)

    key = calibration_key(gm, config, placement, data_fingerprint(source))
    ranges = None
    if use_cache and cache_dir is not None:
        ranges = load_ranges(cache_dir, key, placement)
    passes = 0
    origin = "cache" if ranges is not None else "calibrated"
    if ranges is None:
        observed, calibrators = insert_observers(gm, placement, config)
        passes = calibrate(observed, source, progress=True if progress is None else progress)
        ranges = ranges_from_calibrators(calibrators, placement, config)
    quantized, weights = insert_fake_quant(gm, placement, config, ranges)
    cache_path = None
    if use_cache and cache_dir is not None and origin == "calibrated":
        cache_path = store_ranges(cache_dir, key, ranges, config, weights)
    for ident, reason in placement.float_layers:
        logger.info("left in float: %s (%s)", ident, reason)
    report = {
        "backend": backend.name,
        "config": config.to_dict(),
        "ranges_from": origin,
        "calibration_forward_passes": passes,
        "calibration_key": key,
        "calibration_cache_file": cache_path,
        "smoothed": smoothed,
        "rewritten": rewritten,
        "quantized_layers": placement.quantized_layers,
        "float_layers": [{"id": i, "reason": r} for i, r in placement.float_layers],
        "activation_count": len(placement.activations),
        "weight_count": len(placement.weights),
        "ranges": ranges,
    }
    quantized.meta["embedl_quantization"] = report
    return quantized, report


def quantize_for_pipeline(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Any, settings: Any
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The pipeline's quantization hook (``settings.quantize == "int8"``).

    Calibrates on ``settings.calibration_data``; without it, on the example inputs (one batch;
    the torch.compile backend uses :func:`~.lazy.calibrate_then_build` to calibrate on real
    calls instead).
    """
    data = settings.calibration_data
    if data is None:
        data = [tuple(t for t in example_inputs if isinstance(t, torch.Tensor))]
    return quantize_graph(
        gm,
        backend,
        data,
        observer=settings.observer,
        cache_dir=settings.cache_dir if settings.calibration_cache else None,
        use_cache=settings.calibration_cache,
        progress=settings.progress,
    )


def quantize(
    model: nn.Module,
    args: Sequence[Any],
    config: QuantizationConfig | None = None,
    forward_loop: Callable[[nn.Module], Any] | None = None,
    *,
    calibration_data: Iterable[Any] | None = None,
    backend: Any = None,
    observer: str | None = None,
    cache_dir: Any = None,
    progress: bool | None = None,
) -> fx.GraphModule:
    """Fuse and quantize ``model``: the fake-quant GraphModule, for inspection, export or QAT.

    Args:
        model: an ``nn.Module`` or GraphModule (not modified).
        args: example inputs.
        config: quantization config; the backend's when None.
        forward_loop: callable running calibration data through the model it is given.
        calibration_data: batches instead of ``forward_loop`` (default: ``[args]``).
        backend: Backend or name; the active one when None.
        observer: activation observer override.
        cache_dir: calibration cache root (None: no cache).
        progress: tqdm bar.

    Returns:
        The quantized GraphModule; ``gm.meta["embedl_quantization"]`` holds the report.
    """
    from embedl_dynamo.transform import transform

    backend = resolve_backend(backend)
    if forward_loop is not None and calibration_data is not None:
        raise ValueError("give forward_loop or calibration_data, not both")
    data = forward_loop if forward_loop is not None else calibration_data
    if data is None:
        data = [tuple(args)]
    fused = transform(
        model, tuple(args), [*backend.conversion_patterns, *backend.fusion_patterns]
    ).model
    quantized, _ = quantize_graph(
        fused, backend, data, config=config, observer=observer, cache_dir=cache_dir,
        use_cache=cache_dir is not None, progress=progress,
    )  # fmt: skip
    return quantized
