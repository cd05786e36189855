"""The ``fp8`` precision's stage: TensorRT's FP8 (E4M3FN) explicit quantization.

The graph is calibrated exactly as for the tensorrt target's INT8 (the same placement, the same
observers and calibration cache), the placement is cut to the layers TensorRT runs in FP8
(:mod:`.placement`), and each quantizer becomes an FP8 one with the same ``amax``
(:mod:`.qdq`): per-tensor activation scales ``amax / 448``, per-channel weight scales on axis
0. Every other layer keeps the graph's float type. The ONNX file holds ``QuantizeLinear`` /
``DequantizeLinear`` with ``FLOAT8E4M3FN`` zero points at opset 19 or later, weights stored as
FP8 initializers (:mod:`embedl_dynamo.onnx.fp8_weights`).

FP8 needs TensorRT on a GPU with FP8 tensor cores (Ada, Hopper and newer) to be fast; ONNX
Runtime runs the same file on a CPU through float kernels between Q/DQ, which proves its numbers,
not its speed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.quant.fp8.placement import fp8_placement
from embedl_dynamo.quant.fp8.qdq import convert_to_fp8
from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.stage import QUANTIZATION_META, calibrate_graph
from embedl_dynamo.rewrite.qdq import Role
from embedl_dynamo.settings import Settings

__all__ = ["check_fp8_quantizer", "fp8_stage", "quantize_fp8"]


def check_fp8_quantizer(quantizer: Quantizer) -> None:
    """Refuse a target whose INT8 scheme has no symmetric ``amax`` to carry over to FP8.

    Raises:
        ValueError: activations or weights are not symmetric int8, or weights not per channel
            on axis 0; the message names the fix.
    """
    act, weight = quantizer.config.spec(Role.ACTIVATION), quantizer.config.spec(Role.WEIGHT)
    ok = (
        act is not None
        and weight is not None
        and act.dtype == weight.dtype == "int8"
        and act.symmetric
        and weight.symmetric
        and not act.unsigned_nonnegative
        and weight.per_channel
        and weight.axis == 0
    )
    if not ok:
        raise ValueError(
            f"precision='fp8' is TensorRT's and needs a target with symmetric INT8 scales "
            f"(per-channel weights on axis 0); the {quantizer.name!r} target has another "
            "scheme. Use backend='tensorrt'"
        )


def quantize_fp8(
    gm: fx.GraphModule, quantizer: Quantizer, data: Any, **options: Any
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """Calibrate ``gm`` for ``quantizer`` and build its FP8 fake-quant graph.

    Args:
        gm: the fused, canonical float graph (not modified).
        quantizer: the tensorrt target's quantizer (``Backend.quantizer``).
        data: calibration batches or a ``forward_loop(model)``.
        options: as for :func:`~embedl_dynamo.quant.int8.stage.calibrate_graph`.

    Returns:
        ``(FP8 fake-quant GraphModule, report)``: the quantization report of
        :func:`~embedl_dynamo.quant.int8.stage.quantize_graph` (``quantized_layers`` in FP8,
        ``float_layers`` with reasons) plus ``dtype`` and ``layers`` (one record per layer:
        id, precision, reason).
    """
    check_fp8_quantizer(quantizer)
    calibrated = calibrate_graph(gm, quantizer, data, **options)
    placement = fp8_placement(calibrated.gm, calibrated.placement)
    model, report = dataclasses.replace(calibrated, placement=placement).build()
    convert_to_fp8(model)
    report.pop("weights", None)
    report["dtype"] = "float8_e4m3fn"
    report["layers"] = [
        {"id": i, "precision": "fp8", "reason": "TensorRT FP8 (E4M3) layer"}
        for i in report["quantized_layers"]
    ] + [
        {"id": f["id"], "precision": "fp32", "reason": f["reason"]} for f in report["float_layers"]
    ]
    model.meta[QUANTIZATION_META] = report
    return model, report


def fp8_stage(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Any, settings: Settings
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The pipeline's stage of ``precision="fp8"``: calibrate, place, insert FP8 Q/DQ.

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder; the one calibration batch when
            ``settings.calibration_data`` is None.
        backend: the target; its ``quantizer`` must be TensorRT-like (symmetric INT8).
        settings: the calibration options (data, observer, cache, progress).

    Returns:
        ``(FP8 fake-quant graph, report entries)``: ``quantized``, ``quantization``,
        ``layers`` and ``quantize_s``.
    """
    start = time.perf_counter()
    data = settings.calibration_data
    if data is None:
        data = [tuple(t for t in example_inputs if isinstance(t, torch.Tensor))]
    model, report = quantize_fp8(
        gm,
        backend.quantizer,
        data,
        observer=settings.observer,
        cache_dir=settings.cache_dir if settings.calibration_cache else None,
        use_cache=settings.calibration_cache,
        progress=settings.progress,
    )
    return model, {
        "quantized": True,
        "quantization": report,
        "layers": report["layers"],
        "quantize_s": round(time.perf_counter() - start, 4),
    }
