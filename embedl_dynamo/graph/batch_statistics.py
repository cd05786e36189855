"""``batch_norm`` over a tensor's own statistics, written as the ops it computes, at freezing.

``F.batch_norm(x, None, None, weight, bias, training=True, eps=eps)`` has no running statistics
to update: it normalises ``x`` by its own mean and (biased) variance over every axis but the
channel axis (1), and changes nothing else. Models call it that way at inference: timm's
weight standardisation (``StdConv2d``, ``ScaledStdConv2d``: BiT, NFNet, hybrid ViTs)
standardises each convolution's weight with it on every call. It is no training op (the
``training`` flag only says where the statistics come from), and ONNX's ``BatchNormalization``
with ``training_mode`` is not what the runtimes are checked on, so freezing writes it as the
ops it computes, each of which the conformance table judges:

    mean = x.mean(dims, keepdim=True); centered = x - mean
    y = centered * rsqrt((centered * centered).mean(dims, keepdim=True) + eps) [* w + b]

PyTorch accumulates its statistics in double on CPU; the ops above accumulate in the input's
dtype, within the table's float bound of PyTorch's. A ``batch_norm`` with running statistics
is left as it is: with ``training=True`` it trains, which :func:`~embedl_dynamo.graph.freeze.
inference_blocker` refuses, and without, its eval form has a row of its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import node_value_meta

__all__ = ["batch_norm_arguments", "decompose_batch_statistics", "uses_batch_statistics"]

# per batch_norm callable: positions of (input, running_mean, running_var, weight, bias,
# training, eps), and their keyword names
_POSITIONS = {
    F.batch_norm: (0, 1, 2, 3, 4, 5, 7),
    torch.batch_norm: (0, 3, 4, 1, 2, 5, 7),
}
_NAMES = ("input", "running_mean", "running_var", "weight", "bias", "training", "eps")
_DEFAULTS = {"weight": None, "bias": None, "training": False, "eps": 1e-5}
# the dtypes whose own sums are within the float bound of PyTorch's (it accumulates half
# precision in float32): a batch_norm of another dtype is left, and the table keeps it
_ACCURATE = (torch.float32, torch.float64)


def batch_norm_arguments(node: fx.Node) -> dict[str, Any] | None:
    """``node``'s ``batch_norm`` arguments by name (``input``, ``running_mean``,
    ``running_var``, ``weight``, ``bias``, ``training``, ``eps``), or None for another node.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x: F.batch_norm(x, None, None, training=True))
        >>> node = next(n for n in gm.graph.nodes if n.op == "call_function")
        >>> batch_norm_arguments(node)["training"]
        True
    """
    positions = _POSITIONS.get(node.target) if node.op == "call_function" else None
    if positions is None:
        return None
    found: dict[str, Any] = {}
    for name, position in zip(_NAMES, positions):
        if name in node.kwargs:
            found[name] = node.kwargs[name]
        elif len(node.args) > position:
            found[name] = node.args[position]
        else:
            found[name] = _DEFAULTS.get(name)
    return found


def uses_batch_statistics(node: fx.Node) -> bool:
    """Whether ``node`` is a ``batch_norm`` over its input's own statistics that updates
    nothing: ``training=True`` with no running mean or variance.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x: F.batch_norm(x, None, None, training=True))
        >>> [uses_batch_statistics(n) for n in gm.graph.nodes]
        [False, True, False]
    """
    return _over_own_statistics(batch_norm_arguments(node))


def _over_own_statistics(found: dict[str, Any] | None) -> bool:
    return (
        found is not None
        and bool(found["training"])
        and found["running_mean"] is None
        and found["running_var"] is None
    )


def _channel_shape(rank: int) -> tuple[int, ...]:
    return (1, -1, *([1] * (rank - 2)))


def _decompose(graph: fx.Graph, node: fx.Node, found: dict[str, Any], rank: int) -> list[fx.Node]:
    """The ops ``node`` computes (its arguments ``found``), inserted before it, its users
    moved to the last."""
    x, eps = found["input"], float(found["eps"])
    dims = [0, *range(2, rank)]
    call = graph.call_function
    with graph.inserting_before(node):
        added = [call(torch.mean, (x,), {"dim": dims, "keepdim": True})]
        added.append(call(torch.sub, (x, added[-1])))
        centered = added[-1]
        added.append(call(torch.mul, (centered, centered)))
        added.append(call(torch.mean, (added[-1],), {"dim": dims, "keepdim": True}))
        added.append(call(torch.add, (added[-1], eps)))
        added.append(call(torch.rsqrt, (added[-1],)))
        added.append(call(torch.mul, (centered, added[-1])))
        for name, combine in (("weight", torch.mul), ("bias", torch.add)):
            if isinstance(found[name], fx.Node):
                shaped = call(torch.reshape, (found[name], _channel_shape(rank)))
                added += [shaped, call(combine, (added[-1], shaped))]
    node.replace_all_uses_with(added[-1])
    graph.erase_node(node)
    return added


def decompose_batch_statistics(gm: fx.GraphModule) -> int:
    """Write each ``batch_norm`` of ``gm`` over its input's own statistics
    (:func:`uses_batch_statistics`) of a float32 or float64 input of known rank as the ops
    it computes; the number rewritten. One left (half precision, no recorded shape) is judged
    as ``batch_norm(batch statistics)``, which no runtime takes.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x: F.batch_norm(x, None, None, training=True))
        >>> decompose_batch_statistics(gm)  # no shape known: left as it is
        0
    """
    rewritten = 0
    for node in list(gm.graph.nodes):
        found = batch_norm_arguments(node)
        value = node_value_meta(node) if _over_own_statistics(found) else None
        if not isinstance(value, torch.Tensor) or value.dtype not in _ACCURATE or value.dim() < 2:
            continue
        infer_meta(gm, _decompose(gm.graph, node, found, value.dim()))
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
