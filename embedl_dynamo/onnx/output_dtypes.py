"""The exported file's outputs in PyTorch's dtypes.

An exporter may keep an ONNX op's own result type where PyTorch promotes (an integer
reduction it did not cast); the file then returns another dtype than eager for the same
graph. :func:`cast_outputs` appends a ``Cast`` to the dtype PyTorch gives, on each graph output
whose declared type differs, so a file's outputs (and the sidecar that describes them) carry
PyTorch's dtypes. The graph itself is fixed at the source where the cause is known
(:mod:`embedl_dynamo.graph.integer_accumulation`); this is the net under the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["cast_outputs", "onnx_elem_type"]

logger = logging.getLogger(__name__)


def onnx_elem_type(dtype: torch.dtype) -> int | None:
    """ONNX's ``TensorProto`` element type of ``dtype``; None for a type ONNX lacks."""
    from onnx import TensorProto

    names = {
        torch.float32: "FLOAT",
        torch.float64: "DOUBLE",
        torch.float16: "FLOAT16",
        torch.bfloat16: "BFLOAT16",
        torch.int64: "INT64",
        torch.int32: "INT32",
        torch.int16: "INT16",
        torch.int8: "INT8",
        torch.uint8: "UINT8",
        torch.bool: "BOOL",
        torch.float8_e4m3fn: "FLOAT8E4M3FN",
        torch.float8_e5m2: "FLOAT8E5M2",
    }
    name = names.get(dtype)
    return getattr(TensorProto, name) if name is not None else None


def cast_outputs(model: Any, dtypes: Sequence[torch.dtype]) -> int:
    """Give each output of ``model`` (an ``onnx.ModelProto``, changed in place) the element
    type of ``dtypes`` (PyTorch's, in the outputs' order) where its declared type differs.

    Returns:
        How many outputs were cast.
    """
    from onnx import helper

    graph, cast = model.graph, 0
    for output, dtype in zip(graph.output, dtypes):
        want = onnx_elem_type(dtype)
        have = output.type.tensor_type.elem_type
        if want is None or not have or have == want:
            continue
        if not any(output.name in node.output for node in graph.node):
            continue  # an input or weight returned as it is: it has the input's dtype
        inner = f"{output.name}_before_cast"
        for node in graph.node:
            node.output[:] = [inner if name == output.name else name for name in node.output]
            node.input[:] = [inner if name == output.name else name for name in node.input]
        graph.node.append(helper.make_node("Cast", [inner], [output.name], to=want))
        output.type.tensor_type.elem_type = want
        logger.debug("output %s cast to %s, the dtype PyTorch gives", output.name, dtype)
        cast += 1
    return cast
