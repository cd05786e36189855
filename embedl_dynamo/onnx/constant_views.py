"""Which initializers of an export are a transformed graph's constant transposed.

The TorchScript exporter folds a linear layer's ``x @ W.t()`` into ``MatMul(x, Wt)``, where
``Wt`` is an initializer of its own (``onnx::MatMul_123``): a transposed view of the graph's
constant ``W``. A refit (:mod:`.refit_weights`) writes new weights into the file by the
constants' names; without knowing that ``Wt`` is ``W.t()``, it cannot prove what a new export
would write there, and builds anew. At export the two share memory, so it is proved there, by
the view's storage, and written into the file's metadata (:data:`TRANSPOSED_KEY`), where a
refit in any later process reads it.

A constant the exporter folded into others (a buffer of positions sliced at export, a rotary
embedding's frequencies) is no initializer at all: its digest is recorded
(:data:`FOLDED_KEY`), so that a refit whose weights leave it unchanged knows that nothing
derived from it changed either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.nodes import constant_value
from embedl_dynamo.graph.weight_recipe import tensor_digest

#: how the exporter names the initializer of a transformed graph's constant ``name``
EXPORTED_PREFIX = "gm."

__all__ = [
    "FOLDED_KEY",
    "FOLDED_MAX_BYTES",
    "INT8_SUFFIX",
    "TRANSPOSED_KEY",
    "folded_constants",
    "mark_constant_views",
    "transposed_constants",
]

#: the ONNX metadata entry: JSON ``{initializer name: constant name}``
TRANSPOSED_KEY = "embedl.transposed_constants"
#: the ONNX metadata entry: JSON ``{constant name: its digest}`` of the constants folded away
FOLDED_KEY = "embedl.folded_constants"
#: a weight's initializer folded to int8 as the file is written is named ``gm.<name>_int8``
INT8_SUFFIX = "_int8"
#: the largest folded constant hashed at export (a buffer of positions, a rotary table's
#: frequencies); a larger one is not recorded, and a refit of new weights builds anew
FOLDED_MAX_BYTES = 1 << 20


def _view_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def mark_constant_views(
    model: Any, weights: Mapping[str, torch.Tensor], gm: fx.GraphModule
) -> dict[str, str]:
    """Record in ``model``'s metadata each initializer of ``weights`` that is ``C.t()`` of a
    2-D constant ``C`` of ``gm`` (the same memory, read transposed), and the digest of each
    constant that is neither an initializer nor one's transposed memory; returns the first."""
    constants = _graph_constants(gm)
    views = {}
    for name, value in constants:
        if value.dim() == 2 and value.numel() > 1:
            views.setdefault(_view_key(value.t()), name)
    transposed = {}
    for name, tensor in weights.items():
        if tensor.dim() == 2 and not name.startswith(EXPORTED_PREFIX):
            constant = views.get(_view_key(tensor))
            if constant is not None:
                transposed[name] = constant
    named = {
        n[len(EXPORTED_PREFIX) :].removesuffix(INT8_SUFFIX)
        for n in weights
        if n.startswith(EXPORTED_PREFIX)
    }
    kept = named | set(transposed.values())
    folded = {
        n: tensor_digest(v)
        for n, v in constants
        if n not in kept and v.numel() * v.element_size() <= FOLDED_MAX_BYTES
    }
    for key, mapping in ((TRANSPOSED_KEY, transposed), (FOLDED_KEY, folded)):
        if mapping:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, json.dumps(mapping, sort_keys=True)
    return transposed


def _graph_constants(gm: fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    """The constants the exporter names ``gm.<name>``: the graph's ``get_attr`` tensors and its
    submodules' parameters and buffers (a fused layer's weight)."""
    found = [(n, t) for n, t in gm.named_parameters()] + list(gm.named_buffers())
    for node in gm.graph.nodes:
        value = constant_value(gm, node) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor):
            found.append((str(node.target), value))
    return found


def folded_constants(model: Any) -> dict[str, str]:
    """Constant name -> its digest at export, for the constants the export folded away."""
    for entry in model.metadata_props:
        if entry.key == FOLDED_KEY:
            return dict(json.loads(entry.value))
    return {}


def transposed_constants(model: Any) -> dict[str, list[str]]:
    """Constant name -> the initializers that hold it transposed, as the export recorded."""
    by_constant: dict[str, list[str]] = {}
    for entry in model.metadata_props:
        if entry.key == TRANSPOSED_KEY:
            for initializer, constant in json.loads(entry.value).items():
                by_constant.setdefault(constant, []).append(initializer)
    return by_constant
