"""Calibrate on a compiled model's first real calls, then switch to the quantized artifact.

When ``precision="int8"`` is given without ``calibration_data``, the torch.compile backend wraps
the fused float graph with :func:`calibrate_then_build`. For the first
``settings.calibration_steps`` calls the wrapper runs the float graph (``phase ==
"calibrating"``) and keeps a copy of each call's inputs; at the last of them it calibrates on
those inputs (ranges come from the on-disk cache when present), builds the quantized graph,
hands it to ``build`` (the runtime) and runs that from then on (``phase == "quantized"``).
The phase change is logged at INFO. A call whose float inputs hold NaN or infinity is answered
by the float graph and not calibrated on (nor counted): its ranges would be NaN, and the INT8
artifact refuses such calls anyway (they run in PyTorch).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.stage import quantize_graph
from embedl_dynamo.settings import Settings

__all__ = ["LazyInt8", "calibrate_then_build"]

logger = logging.getLogger(__name__)


class LazyInt8:
    """The callable :func:`calibrate_then_build` returns.

    Attributes:
        phase: ``"calibrating"`` or ``"quantized"``.
        steps_seen: calls calibrated on so far (calls with NaN or infinity are not).
        report: the quantization report once quantized.
    """

    def __init__(
        self,
        float_gm: fx.GraphModule,
        quantizer: Quantizer,
        settings: Settings,
        build: Callable[[fx.GraphModule], Callable[..., Any] | None],
    ) -> None:
        self.float_gm = float_gm
        self.quantizer = quantizer
        self.settings = settings
        self.build = build
        self.steps = int(settings.calibration_steps)
        self.phase = "calibrating"
        self.steps_seen = 0
        self.report: dict[str, Any] | None = None
        self._batches: list[tuple[torch.Tensor, ...]] = []
        self._infer: Callable[..., Any] | None = None
        self._lock = threading.Lock()
        logger.info("INT8: calibrating on the first %d calls (running in float)", self.steps)

    def __call__(self, *args: Any) -> Any:
        if self._infer is not None:
            return self._infer(*args)
        with self._lock:  # threads share one calibration: steps counted once, built once
            if self._infer is None:
                with torch.no_grad():
                    out = self.float_gm(*args)
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                if not all(_finite(t) for t in tensors):
                    logger.info("INT8: a call with NaN or infinity is not calibrated on")
                    return out
                self._batches.append(tuple(t.detach().clone() for t in tensors))
                self.steps_seen += 1
                if self.steps_seen >= self.steps:
                    self._finish()
                return out
        return self._infer(*args)

    def _finish(self) -> None:
        settings = self.settings
        quantized, self.report = quantize_graph(
            self.float_gm,
            self.quantizer,
            self._batches,
            observer=settings.observer,
            cache_dir=settings.cache_dir if settings.calibration_cache else None,
            use_cache=settings.calibration_cache,
            progress=settings.progress,
        )
        self._batches = []
        infer = self.build(quantized)
        if infer is None:  # the runtime could not take the INT8 graph: stay in float
            logger.warning("INT8: the runtime could not take the quantized graph; staying in float")
            self._infer, self.phase = self.float_gm, "float"
            return
        self._infer = infer
        self.phase = "quantized"
        logger.info(
            "INT8: calibrated on %d calls (ranges from %s); now running the quantized model",
            self.steps_seen,
            self.report["ranges_from"],
        )


def _finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN or infinity (integers always)."""
    return not tensor.is_floating_point() or bool(torch.isfinite(tensor).all())


def calibrate_then_build(
    float_gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    quantizer: Quantizer,
    settings: Settings,
    build: Callable[[fx.GraphModule], Callable[..., Any] | None],
) -> LazyInt8:
    """Wrap ``float_gm`` so it calibrates on its first calls, then runs ``build(quantized)``.

    Args:
        float_gm: the fused float graph.
        example_inputs: the first call's inputs (unused; real calls are the calibration data).
        quantizer: the target's quantizer (``Backend.quantizer``).
        settings: compile settings (``calibration_steps``, ``observer``, cache options).
        build: turns the quantized GraphModule into the runtime callable (None: it cannot).

    Returns:
        A :class:`LazyInt8` callable with a ``phase`` attribute.
    """
    return LazyInt8(float_gm, quantizer, settings, build)
