"""Rewrite any FX graph into the canonical form the pattern engine matches on.

Two kinds of graph arrive here:

* graphs from ``torch.fx.symbolic_trace``, which keep ``call_module`` nodes (``nn.Conv2d``,
  ``nn.ReLU``, ``nn.MultiheadAttention``…) and ``call_method`` nodes (``x.relu()``, ``x.view(…)``);
* graphs from Dynamo, where module calls are inlined into functions (``torch.conv2d``,
  ``F.batch_norm``, ``operator.iadd``…) and, once frozen, weights are ``get_attr`` constants.

After :func:`canonicalize` both look the same: each supported operation is one ``call_function``
node on the target listed in :mod:`embedl_dynamo.graph.canonical_ops`, with keyword-only inputs and
defaults filled in; weights are ``get_attr`` nodes; in-place ops are made functional; every node
knows the module path it came from. Operations outside the canonical set are left untouched:
they still run, they just match no pattern.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph import canonical_ops
from embedl_dynamo.graph.attention_forms import bind_attention_scales
from embedl_dynamo.graph.canonical_ops import bind
from embedl_dynamo.graph.division import floor_division
from embedl_dynamo.graph.integer_accumulation import accumulate_integers_in_int64
from embedl_dynamo.graph.module_forms import MODULE_CANONICALIZERS
from embedl_dynamo.graph.nodes import (
    PATH_KEY,
    copy_meta,
    is_tensor_node,
    module_path,
    node_shape,
)

__all__ = ["canonicalize", "MODULE_CANONICALIZERS"]

logger = logging.getLogger(__name__)

# alias target -> (canonical target, keyword renames, in-place?)
_FUNCTION_ALIASES: dict[Any, Callable[..., Any]] = {
    F.relu: torch.relu,
    torch.relu_: torch.relu,
    F.relu_: torch.relu,
    F.relu6: F.relu6,
    F.silu: F.silu,
    F.hardswish: F.hardswish,
    F.hardsigmoid: F.hardsigmoid,
    F.sigmoid: torch.sigmoid,
    F.tanh: torch.tanh,
    operator.add: torch.add,
    operator.iadd: torch.add,
    operator.mul: torch.mul,
    operator.imul: torch.mul,
    operator.matmul: torch.matmul,
    torch.softmax: F.softmax,
    torch._C._nn.adaptive_avg_pool2d: F.adaptive_avg_pool2d,
}
_INPLACE_FUNCTIONS = {torch.relu_, F.relu_, operator.iadd, operator.imul}
# activations whose Python signature is ``(input, inplace=False)``
_POSITIONAL_INPLACE = {torch.relu, F.relu6, F.silu, F.hardswish, F.hardsigmoid}

_METHOD_ALIASES: dict[str, Callable[..., Any]] = {
    "relu": torch.relu,
    "relu_": torch.relu,
    "sigmoid": torch.sigmoid,
    "sigmoid_": torch.sigmoid,
    "tanh": torch.tanh,
    "add": torch.add,
    "add_": torch.add,
    "__add__": torch.add,
    "mul": torch.mul,
    "mul_": torch.mul,
    "matmul": torch.matmul,
    "flatten": torch.flatten,
    "softmax": F.softmax,
    "contiguous": canonical_ops.contiguous,
}
_INPLACE_METHODS = {"relu_", "sigmoid_", "add_", "mul_"}

# Targets whose inputs must be tensors for the rewrite to torch.* to be valid (``size + 1`` is not).
_TENSOR_ONLY = {torch.add, torch.mul, torch.matmul}


# ---------------------------------------------------------------------------------------------
# call_function / call_method -> canonical call_function
# ---------------------------------------------------------------------------------------------


def _flatten_from_view(node: fx.Node) -> dict[str, Any] | None:
    """``x.view(n, -1)`` / ``reshape`` is ``flatten(x, start_dim=k)`` when the shapes say so."""
    source = node.args[0] if node.args else None
    in_shape, out_shape = node_shape(source), node_shape(node)
    if in_shape is None or out_shape is None or not 1 <= len(out_shape) < len(in_shape):
        return None
    start = len(out_shape) - 1
    try:
        if tuple(in_shape[:start]) != tuple(out_shape[:start]):
            return None
        flat = 1
        for size in in_shape[start:]:
            flat = flat * size
        if flat != out_shape[start]:
            return None
    except Exception:  # symbolic sizes that cannot be compared statically
        return None
    return {"input": source, "start_dim": start, "end_dim": -1}


def _rewrite_target(node: fx.Node, gm: fx.GraphModule) -> tuple[Any, dict, Any] | None:
    """Return (canonical target, bound kwargs, mutated input or None) for ``node``, or None."""
    floor = floor_division(node, gm)
    if floor is not None:
        return torch.div, floor, None
    inplace_input = None
    if node.op == "call_method":
        name = str(node.target)
        if name in ("view", "reshape"):
            bound = _flatten_from_view(node)
            return (torch.flatten, bound, None) if bound else None
        target = _METHOD_ALIASES.get(name)
        if target is None:
            return None
        if name in _INPLACE_METHODS:
            inplace_input = node.args[0]
    elif node.op == "call_function":
        if node.target is torch.reshape:
            bound = _flatten_from_view(node)
            return (torch.flatten, bound, None) if bound else None
        if node.target is torch.batch_norm:
            names = (
                "input",
                "weight",
                "bias",
                "running_mean",
                "running_var",
                "training",
                "momentum",
                "eps",
            )
            bound = dict(zip(names, node.args))
            return F.batch_norm, bind(F.batch_norm, (), bound) or {}, None
        if node.target is F.hardtanh:
            args = list(node.args) + [None] * 3
            lo = node.kwargs.get("min_val", args[1] if len(node.args) > 1 else -1.0)
            hi = node.kwargs.get("max_val", args[2] if len(node.args) > 2 else 1.0)
            if (lo, hi) != (0.0, 6.0):
                return None
            inplace = node.kwargs.get("inplace", False)
            return F.relu6, {"input": node.args[0]}, node.args[0] if inplace else None
        target = _FUNCTION_ALIASES.get(node.target, node.target)
        if canonical_ops.signature_of(target) is None:
            return None
        if node.target in _INPLACE_FUNCTIONS:
            inplace_input = node.args[0]
    else:
        return None

    args = node.args[1:] if node.op == "call_method" else node.args
    args = ((node.args[0],) + tuple(args)) if node.op == "call_method" else tuple(args)
    kwargs = dict(node.kwargs)
    if target in _POSITIONAL_INPLACE and len(args) == 2 and node.op == "call_function":
        # Dynamo records ``F.hardswish(x, False)``: the second positional is ``inplace``
        kwargs["inplace"], args = args[1], args[:1]
    if kwargs.pop("inplace", False):
        inplace_input = args[0] if args else kwargs.get("input")
    if target is F.dropout and "train" in kwargs:
        kwargs["training"] = kwargs.pop("train")
    if target in _TENSOR_ONLY and not any(is_tensor_node(a, gm) for a in args[:2]):
        return None
    bound = bind(target, tuple(args), kwargs)
    if bound is None:
        return None
    if target is torch.add and bound.get("alpha", 1) != 1:
        return None
    if target is F.softmax:
        bound.pop("_stacklevel", None)
        bound = bind(target, (), bound)
    return target, bound, inplace_input


def _functionalize(graph: fx.Graph, node: fx.Node, mutated: Any) -> None:
    """Make an in-place op functional: later readers of ``mutated`` read ``node`` instead."""
    if not isinstance(mutated, fx.Node):
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    position = order[node]
    for user in list(mutated.users):
        if user is not node and order.get(user, -1) > position:
            user.replace_input_with(mutated, node)


def _canonicalize_module_call(gm: fx.GraphModule, node: fx.Node) -> bool:
    module = gm.get_submodule(str(node.target))
    rewrite = MODULE_CANONICALIZERS.get(type(module))
    if rewrite is None:
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        new = rewrite(gm, graph, node, module)
    if new is None:
        return False
    for created in _nodes_between(graph, new, node):
        created.meta.setdefault(PATH_KEY, str(node.target))
        if not created.meta[PATH_KEY]:
            created.meta[PATH_KEY] = str(node.target)
    own_path = new.meta.get(PATH_KEY) or ""
    copy_meta(node, new)
    # an expansion's last node may belong to a submodule (``encoder`` -> ``encoder.layers.1``)
    inner = own_path.startswith(f"{node.target}.")
    new.meta[PATH_KEY] = own_path if inner else str(node.target)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


def _nodes_between(graph: fx.Graph, last: fx.Node, stop: fx.Node) -> list[fx.Node]:
    """The nodes inserted just before ``stop`` up to and including ``last`` (walking backwards)."""
    nodes = []
    current = stop.prev
    while current is not last and current.op != "root":
        nodes.append(current)
        current = current.prev
    nodes.append(last)
    return nodes


def canonicalize(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite ``gm`` in place into the canonical form and return it.

    Idempotent: canonical nodes are left as they are, so running it twice changes nothing.
    """
    graph = gm.graph
    accumulate_integers_in_int64(gm)
    for node in list(graph.nodes):
        if node.op in ("placeholder", "output", "get_attr"):
            node.meta.setdefault(PATH_KEY, module_path(node))
            continue
        if node.op == "call_module":
            if _canonicalize_module_call(gm, node):
                continue
            node.meta[PATH_KEY] = str(node.target)
            continue
        rewritten = _rewrite_target(node, gm)
        path = module_path(node)
        if rewritten is None:
            node.meta[PATH_KEY] = path
            continue
        target, bound, mutated = rewritten
        if (
            node.op == "call_function"
            and node.target is target
            and not node.args
            and dict(node.kwargs) == bound
        ):
            node.meta[PATH_KEY] = path
            continue
        with graph.inserting_before(node):
            new = graph.call_function(target, (), bound)
        copy_meta(node, new)
        new.meta[PATH_KEY] = path
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        if mutated is not None:
            _functionalize(graph, new, mutated)
    bind_attention_scales(gm)
    graph.lint()
    gm.recompile()
    return gm
