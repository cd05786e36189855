"""Canonical forms of the common ``nn`` layers a traced graph keeps as ``call_module`` nodes.

``torch.fx.symbolic_trace`` leaves ``nn.Conv2d``, ``nn.Linear``, the norms, activations, pooling,
dropout and so on as ``call_module`` nodes; Dynamo inlines them into functions on frozen weights.
:data:`MODULE_CANONICALIZERS` maps each layer type to the rewrite that turns the leaf into the
keyword-only ``call_function`` Dynamo would record (weights as ``get_attr`` nodes), so that
``canonicalize`` gives both kinds of graph one form. The attention modules' expansions live in
:mod:`embedl_dynamo.graph.attention_forms` and are merged into the same table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.attention_forms import ATTENTION_CANONICALIZERS
from embedl_dynamo.graph.canonical_ops import identity
from embedl_dynamo.graph.nodes import canonical_call

__all__ = ["MODULE_CANONICALIZERS"]


def _param(gm: fx.GraphModule, graph: fx.Graph, qualname: str, name: str) -> fx.Node | None:
    module = gm.get_submodule(qualname)
    if getattr(module, name, None) is None:
        return None
    return graph.get_attr(f"{qualname}.{name}" if qualname else name)


def _conv(gm, graph, node, module: nn.Module):
    if module.padding_mode != "zeros":
        return None
    target = {nn.Conv1d: torch.conv1d, nn.Conv2d: torch.conv2d, nn.Conv3d: torch.conv3d}[
        type(module)
    ]
    q = str(node.target)
    return canonical_call(
        graph,
        target,
        input=node.args[0],
        weight=_param(gm, graph, q, "weight"),
        bias=_param(gm, graph, q, "bias"),
        stride=module.stride,
        padding=module.padding,
        dilation=module.dilation,
        groups=module.groups,
    )


def _linear(gm, graph, node, module: nn.Linear):
    q = str(node.target)
    return canonical_call(
        graph,
        F.linear,
        input=node.args[0],
        weight=_param(gm, graph, q, "weight"),
        bias=_param(gm, graph, q, "bias"),
    )


def _batch_norm(gm, graph, node, module: nn.modules.batchnorm._BatchNorm):
    if module.running_mean is None or module.running_var is None:
        return None
    q = str(node.target)
    return canonical_call(
        graph,
        F.batch_norm,
        input=node.args[0],
        running_mean=_param(gm, graph, q, "running_mean"),
        running_var=_param(gm, graph, q, "running_var"),
        weight=_param(gm, graph, q, "weight"),
        bias=_param(gm, graph, q, "bias"),
        training=module.training,
        momentum=module.momentum if module.momentum is not None else 0.0,
        eps=module.eps,
    )


def _layer_norm(gm, graph, node, module: nn.LayerNorm):
    q = str(node.target)
    return canonical_call(
        graph,
        F.layer_norm,
        input=node.args[0],
        normalized_shape=tuple(module.normalized_shape),
        weight=_param(gm, graph, q, "weight"),
        bias=_param(gm, graph, q, "bias"),
        eps=module.eps,
    )


def _activation(target: Callable[..., Any]):
    def rewrite(gm, graph, node, module):
        return canonical_call(graph, target, input=node.args[0])

    return rewrite


def _gelu(gm, graph, node, module: nn.GELU):
    return canonical_call(graph, F.gelu, input=node.args[0], approximate=module.approximate)


def _max_pool2d(gm, graph, node, module: nn.MaxPool2d):
    return canonical_call(
        graph,
        F.max_pool2d,
        input=node.args[0],
        kernel_size=module.kernel_size,
        stride=module.stride,
        padding=module.padding,
        dilation=module.dilation,
        ceil_mode=module.ceil_mode,
        return_indices=module.return_indices,
    )


def _adaptive_avg_pool2d(gm, graph, node, module: nn.AdaptiveAvgPool2d):
    return canonical_call(
        graph, F.adaptive_avg_pool2d, input=node.args[0], output_size=module.output_size
    )


def _flatten(gm, graph, node, module: nn.Flatten):
    return canonical_call(
        graph, torch.flatten, input=node.args[0], start_dim=module.start_dim, end_dim=module.end_dim
    )


def _dropout(gm, graph, node, module: nn.Dropout):
    return canonical_call(
        graph, F.dropout, input=node.args[0], p=module.p, training=module.training
    )


def _identity(gm, graph, node, module):
    return canonical_call(graph, identity, input=node.args[0])


def _softmax(gm, graph, node, module: nn.Softmax):
    return canonical_call(graph, F.softmax, input=node.args[0], dim=module.dim)


# module type -> rewrite(gm, graph, node, module) -> canonical node or None (leave as is).
MODULE_CANONICALIZERS: dict[type[nn.Module], Callable[..., fx.Node | None]] = {
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.Conv3d: _conv,
    nn.Linear: _linear,
    nn.BatchNorm1d: _batch_norm,
    nn.BatchNorm2d: _batch_norm,
    nn.BatchNorm3d: _batch_norm,
    nn.LayerNorm: _layer_norm,
    nn.ReLU: _activation(torch.relu),
    nn.ReLU6: _activation(F.relu6),
    nn.SiLU: _activation(F.silu),
    nn.Hardswish: _activation(F.hardswish),
    nn.Hardsigmoid: _activation(F.hardsigmoid),
    nn.Sigmoid: _activation(torch.sigmoid),
    nn.Tanh: _activation(torch.tanh),
    nn.GELU: _gelu,
    nn.MaxPool2d: _max_pool2d,
    nn.AdaptiveAvgPool2d: _adaptive_avg_pool2d,
    nn.Flatten: _flatten,
    nn.Dropout: _dropout,
    nn.Identity: _identity,
    nn.Softmax: _softmax,
    **ATTENTION_CANONICALIZERS,
}
