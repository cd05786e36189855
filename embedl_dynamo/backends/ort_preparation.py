"""ONNX Runtime's preparation rewrite (phase ``quantized``): split fused groups its integer
kernels cannot run as one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.nodes import PATH_KEY, canonical_call, module_path
from embedl_dynamo.patterns.fused_modules import (
    ACTIVATIONS,
    FusedConv,
    FusedConvAdd,
    FusedConvMaxPool,
    FusedLinear,
)
from embedl_dynamo.quant.int8.rules import PreparationRewrite

__all__ = ["ORT_INTEGER_ACTIVATIONS", "SplitFusedForORT"]


def _canonical_activation(name: str) -> Any:
    return next(target for target, label in ACTIVATIONS.items() if label == name)


# The activations ONNX Runtime folds into QLinearConv / QGemm (the output Q's range clips them).
# After any other (hardswish, hardsigmoid, silu, gelu) ORT's QDQ fusion does not fire and the
# conv or linear would keep running in float between Q/DQ nodes.
ORT_INTEGER_ACTIVATIONS = (None, "relu", "relu6")


def _activation_call(graph: fx.Graph, name: str, path: str, value: fx.Node) -> fx.Node:
    if name == "gelu_tanh":
        return canonical_call(graph, F.gelu, path=path, input=value, approximate="tanh")
    return canonical_call(graph, _canonical_activation(name), path=path, input=value)


class SplitFusedForORT(PreparationRewrite):
    """ONNX Runtime: split fused groups whose inner conv or linear output needs its own Q/DQ.

    ORT forms QLinearConv / QGemm only when the conv's (linear's) output is quantized right after
    it, or after a ReLU/ReLU6 its Q range absorbs. So ``act(conv(x) + r)`` becomes ``conv`` ->
    ``add`` -> ``act``; ``maxpool(act(conv(x)))`` becomes ``act(conv)`` -> ``maxpool``; and a
    conv or linear fused with hardswish, hardsigmoid, SiLU or GELU becomes the bare layer (INT8,
    as ORT's own quantizer places it) followed by the activation, which runs in float between
    DQ and the next Q. The math is unchanged.
    """

    name = "split_fused_for_ort"

    def rewrite_module(self, gm: fx.GraphModule, node: fx.Node, module: nn.Module) -> bool:
        """Replace ``node`` (a fused call ORT cannot run as one integer kernel) by its split."""
        is_add = isinstance(module, FusedConvAdd)
        is_pool = isinstance(module, FusedConvMaxPool)
        activation = getattr(module, "activation", None)
        split_activation = (
            isinstance(module, (FusedConv, FusedLinear))
            and activation not in ORT_INTEGER_ACTIVATIONS
        )
        if not (is_add or is_pool or split_activation):
            return False
        activation_outside = is_add or split_activation
        if isinstance(module, FusedLinear):
            inner: nn.Module = FusedLinear(module.weight, module.bias, kind=module.kind)
        else:
            inner = FusedConv(
                module.weight,
                module.bias,
                module.stride,
                module.padding,
                module.dilation,
                module.groups,
                activation=None if activation_outside else activation,
                kind=module.kind,
            )
        name = f"{node.target}_{'linear' if isinstance(module, FusedLinear) else 'conv'}"
        gm.add_module(name, inner)
        path = module_path(node)
        with gm.graph.inserting_before(node):
            out = gm.graph.call_module(name, (node.args[0],))
            out.meta[PATH_KEY] = path
            if is_add:
                out = canonical_call(
                    gm.graph, torch.add, path=path, input=out, other=node.args[1], alpha=1
                )
            if activation_outside and activation is not None:
                out = _activation_call(gm.graph, activation, path, out)
            if is_pool:
                out = canonical_call(gm.graph, F.max_pool2d, path=path, input=out, **module.pool)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        return True
