"""Rewrites of an OpenVINO model read from our ONNX artifact, before its CPU plugin compiles it.

OpenVINO's ONNX frontend maps some ONNX ops to forms its CPU plugin cannot fuse into the
convolution before them, where the same op converted from PyTorch would be fused. Each rewrite
here replaces one such op with the equivalent OpenVINO op, through OpenVINO's own model API;
the math is unchanged (max abs difference 0):

* ``HardSigmoid(alpha=1/6, beta=0.5)`` (PyTorch's ``hardsigmoid``, the squeeze-excite gate of
  MobileNetV3) becomes ``HSigmoid``, which the plugin fuses into the conv as a post-op, so
  the standalone f32 eltwise nodes and their layout reorders are gone.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["lower_for_openvino"]

logger = logging.getLogger(__name__)

_TOLERANCE = 1e-6


def _scalar(node: Any) -> float | None:
    """The value of a scalar Constant feeding an op, or None."""
    if node.get_type_name() != "Constant":
        return None
    data = node.get_data()
    return float(data.reshape(-1)[0]) if data.size == 1 else None


def _hard_sigmoid_to_hsigmoid(op: Any) -> bool:
    from openvino.opset5 import hsigmoid

    alpha = _scalar(op.input_value(1).get_node())
    beta = _scalar(op.input_value(2).get_node())
    if alpha is None or beta is None:
        return False
    if abs(alpha - 1 / 6) > _TOLERANCE or abs(beta - 0.5) > _TOLERANCE:
        return False
    new = hsigmoid(op.input_value(0))
    new.set_friendly_name(op.get_friendly_name())
    op.output(0).replace(new.output(0))
    return True


_REWRITES = {"HardSigmoid": _hard_sigmoid_to_hsigmoid}


def lower_for_openvino(model: Any) -> dict[str, int]:
    """Apply the rewrites to ``model`` (an ``openvino.Model``) in place.

    Returns:
        ``{op type: how many were rewritten}`` (empty when nothing applied).
    """
    counts: dict[str, int] = {}
    for op in model.get_ordered_ops():
        rewrite = _REWRITES.get(op.get_type_name())
        if rewrite is not None and rewrite(op):
            counts[op.get_type_name()] = counts.get(op.get_type_name(), 0) + 1
    if counts:
        logger.debug("OpenVINO lowering: %s", counts)
    return counts
