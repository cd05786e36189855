"""Floor division as the ONNX exporter rounds it: ``torch.div(a, b, rounding_mode="floor")``."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import is_tensor_node

__all__ = ["floor_division"]

_FLOOR_DIVISIONS = {operator.floordiv, torch.floor_divide, "floor_divide", "__floordiv__"}


def floor_division(node: fx.Node, gm: fx.GraphModule) -> dict[str, Any] | None:
    """``a // b`` on tensors as ``torch.div(a, b, rounding_mode="floor")``: the same op in
    PyTorch, and the spelling the ONNX exporter rounds towards minus infinity (it exports
    ``floor_divide`` as a truncating division, wrong for negative quotients)."""
    target = node.target if node.op == "call_function" else str(node.target)
    if node.op not in ("call_function", "call_method") or target not in _FLOOR_DIVISIONS:
        return None
    if len(node.args) != 2 or node.kwargs:
        return None
    if not any(is_tensor_node(a, gm) for a in node.args):
        return None  # sizes (``s0 // 2``) stay Python arithmetic
    return {"input": node.args[0], "other": node.args[1], "rounding_mode": "floor"}
