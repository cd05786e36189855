"""Small helpers over ``torch.fx`` graphs shared by the canonicaliser, the matcher and the passes.

They read shape metadata whichever pass wrote it (Dynamo's ``example_value``, FakeTensorProp's
``val``, ShapeProp's ``tensor_meta``), resolve ``get_attr`` constants and derive the module path
(``layer4.1.conv2``) that names a node in plans and reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.canonical_ops import SIGNATURES, bind

__all__ = [
    "PATH_KEY",
    "canonical_call",
    "constant_value",
    "copy_meta",
    "get_attr_path",
    "is_tensor_node",
    "looked_up",
    "module_path",
    "node_shape",
    "node_value_meta",
]

PATH_KEY = "embedl_path"


def node_value_meta(node: fx.Node) -> Any:
    """The example value (real or fake tensor, or Python value) recorded for ``node``, if any."""
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    tensor_meta = node.meta.get("tensor_meta")
    if tensor_meta is not None:
        return tensor_meta
    return None


def node_shape(node: Any) -> tuple | None:
    """The shape of the tensor ``node`` produces, or None when unknown or not a tensor."""
    if not isinstance(node, fx.Node):
        return None
    value = node_value_meta(node)
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


_TENSOR_PRODUCING_OPS = ("call_module", "placeholder")


def is_tensor_node(node: Any, gm: fx.GraphModule | None = None) -> bool:
    """Whether ``node`` produces a tensor, using metadata when present and the op kind otherwise."""
    if not isinstance(node, fx.Node):
        return False
    value = node_value_meta(node)
    if value is not None:
        return (
            isinstance(value, torch.Tensor) or hasattr(value, "shape") and hasattr(value, "dtype")
        )
    if node.op in _TENSOR_PRODUCING_OPS:
        return True
    if node.op == "get_attr" and gm is not None:
        return isinstance(constant_value(gm, node), torch.Tensor)
    if node.op == "call_function":
        return node.target in SIGNATURES and node.target.__name__ != "getitem"
    return False


def get_attr_path(node: Any) -> str | None:
    """The attribute path of a ``get_attr`` node, or None for anything else."""
    if isinstance(node, fx.Node) and node.op == "get_attr":
        return str(node.target)
    return None


def constant_value(gm: fx.GraphModule, node: Any) -> Any:
    """The tensor behind a ``get_attr`` node, or None when ``node`` is not a constant."""
    path = get_attr_path(node)
    if path is None:
        return None
    value: Any = gm
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


_DYNAMO_ROOT = re.compile(r"^[LG]\[['\"][^'\"]+['\"]\]\.?")
_DYNAMO_INDEX = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def normalize_dynamo_path(path: str) -> str:
    """``L['self'].layer4[1]._modules['conv2']`` -> ``layer4.1.conv2``."""
    path = _DYNAMO_ROOT.sub("", path)
    path = _DYNAMO_INDEX.sub(r".\1", path)
    path = path.replace("._modules.", ".").replace("_modules.", "")
    return path.strip(".")


def module_path(node: fx.Node) -> str:
    """The dotted path of the module a node came from (``layer4.1.conv2``), or ``""``.

    Set by the canonicaliser from ``call_module`` targets and from Dynamo's ``nn_module_stack``.
    """
    path = node.meta.get(PATH_KEY)
    if path is not None:
        return path
    stack = node.meta.get("nn_module_stack")
    if stack:
        last = list(stack.values())[-1]
        raw = last[0] if isinstance(last, tuple) else str(last)
        return normalize_dynamo_path(raw)
    return ""


def copy_meta(source: fx.Node, target: fx.Node) -> None:
    """Give ``target`` the value metadata and module path of ``source``."""
    for key in ("val", "example_value", "tensor_meta", "nn_module_stack", "stack_trace"):
        if key in source.meta:
            target.meta[key] = source.meta[key]
    target.meta[PATH_KEY] = module_path(source)


def canonical_call(
    graph: fx.Graph, target: Callable[..., Any], path: str = "", **kwargs: Any
) -> fx.Node:
    """Create a canonical ``call_function`` node (keyword inputs, defaults filled in).

    Insert it at the graph's current insertion point; ``path`` names the module it belongs to.
    """
    bound = bind(target, (), kwargs)
    if bound is None:
        raise ValueError(f"{getattr(target, '__name__', target)} does not accept {sorted(kwargs)}")
    node = graph.call_function(target, (), bound)
    node.meta[PATH_KEY] = path
    return node


def looked_up(table: Mapping[Any, Any], target: Any) -> Any:
    """``table``'s entry for a node's ``target``, or None: also for a target that cannot be a
    key (an unhashable callable object)."""
    try:
        return table.get(target)
    except TypeError:
        return None
