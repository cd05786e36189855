"""FP8 in the ONNX file: the opset it needs, and weights stored as FP8 initializers.

``QuantizeLinear(W_float, scale, fp8 0) -> DequantizeLinear`` on a constant weight becomes an
``FLOAT8E4M3FN`` initializer read by ``DequantizeLinear``, as ModelOpt writes FP8 weights and as
TensorRT wants them (no QuantizeLinear of a constant left for the builder). The stored values
are what ``QuantizeLinear`` computes: ``saturate(W / scale)`` rounded to the nearest E4M3 value
(ties to even), per channel along ``axis``, so the outputs do not change and the weights take a
quarter of the bytes.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
from torch import nn

from embedl_dynamo.onnx.int8_weights import graph_constants
from embedl_dynamo.quant.fp8.qdq import FP8_MAX, FP8_MIN_OPSET, holds_fp8

__all__ = ["fold_fp8_weights", "fp8_opset", "has_fp8_qdq"]


def fp8_opset(module: nn.Module, opset: int | None, default: int) -> int:
    """The opset to export ``module`` at: ``opset``, else ``default``, raised to
    :data:`~embedl_dynamo.quant.fp8.qdq.FP8_MIN_OPSET` when the graph holds FP8 quantizers.

    Raises:
        ValueError: an FP8 graph and an ``opset`` older than FP8 Q/DQ; the message names the fix.
    """
    if not holds_fp8(module):
        return opset or default
    if opset is not None and opset < FP8_MIN_OPSET:
        raise ValueError(
            f"FP8 Quantize/DequantizeLinear need opset {FP8_MIN_OPSET} or later, not {opset}; "
            f"pass opset={FP8_MIN_OPSET} or leave it None"
        )
    return opset or max(default, FP8_MIN_OPSET)


def _varint(data: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _fields(data: Any, start: int, end: int) -> Any:
    """``(field number, start, end)`` of each length-delimited field of a protobuf message."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            pos = _varint(data, pos)[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            yield key >> 3, pos, pos + length
            pos += length
        else:
            return  # groups: not in ONNX


def _names_qdq(data: Any) -> bool:
    """Whether a serialized ModelProto has a Q/DQ node, reading its nodes only (initializers
    are skipped by length, so a float file costs no parse)."""
    for number, start, end in _fields(data, 0, len(data)):
        if number != 7:  # ModelProto.graph
            continue
        for field, a, b in _fields(data, start, end):
            if field == 1 and data.find(b"QuantizeLinear", a, b) >= 0:  # GraphProto.node
                return True
    return False


def _parsed_if_qdq(model: Any) -> Any:
    """The ``ModelProto`` of serialized bytes or a path when it names a Q/DQ node, else None."""
    import onnx

    if isinstance(model, bytes):
        return onnx.load_from_string(model) if _names_qdq(model) else None
    with open(model, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if not _names_qdq(m):
            return None
    return onnx.load(str(model), load_external_data=False)


def has_fp8_qdq(model: Any) -> bool:
    """Whether the ONNX model (a ``ModelProto``, serialized bytes or a path) holds a Q/DQ with a
    ``FLOAT8E4M3FN`` zero point; external data is not read, a float file is not parsed."""
    import onnx
    from google.protobuf.message import DecodeError

    if not isinstance(model, onnx.ModelProto):
        try:
            model = _parsed_if_qdq(model)
        except (OSError, ValueError, IndexError, DecodeError):
            return False  # not a readable model: its loader names the problem
        if model is None:
            return False
    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    typed = {i.name for i in model.graph.initializer if i.data_type == fp8}
    typed |= {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "Constant" and n.attribute and n.attribute[0].t.data_type == fp8
    }
    qdq = ("QuantizeLinear", "DequantizeLinear")
    return any(
        n.op_type in qdq and len(n.input) > 2 and n.input[2] in typed for n in model.graph.node
    )


def _is_fp8(array: np.ndarray) -> bool:
    import ml_dtypes

    return array.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def fold_fp8_weights(model: Any) -> int:
    """Fold every FP8 ``QuantizeLinear`` of a constant in the ``onnx.ModelProto``, in place.

    Returns:
        The number of weights stored as FP8 (0 leaves the model untouched).
    """
    from onnx import numpy_helper

    graph = model.graph
    if not any(node.op_type == "QuantizeLinear" for node in graph.node):
        return 0
    constants = graph_constants(graph)
    folded, dropped = 0, []
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or len(node.input) < 3:
            continue
        weight, scale, zero = (constants.get(n) for n in node.input[:3])
        if weight is None or scale is None or zero is None or not _is_fp8(zero):
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and scale.size > 1:
            shape = [1] * weight.ndim
            shape[axis] = -1
            scale = scale.reshape(shape)
        scaled = np.clip(weight.astype(np.float32) / scale, -FP8_MAX, FP8_MAX)
        name = f"{node.input[0]}_fp8"
        graph.initializer.append(numpy_helper.from_array(scaled.astype(zero.dtype), name))
        for other in graph.node:  # the DequantizeLinear readers take the FP8 values directly
            for i, value in enumerate(other.input):
                if value == node.output[0]:
                    other.input[i] = name
        graph.node.remove(node)
        dropped.append(node.input[0])
        folded += 1
    if folded:
        still_read = {n for node in graph.node for n in node.input}
        keep = [i for i in graph.initializer if i.name in still_read or i.name not in dropped]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return folded
