"""ONNX Runtime reads a linear layer's weight as the model stores it: ``FusedMatMul(transB=1)``.

The TorchScript exporter folds a linear layer's ``x @ W.t()`` into ``MatMul(x, Wt)``, where
``Wt`` is a transposed view of the model's weight ``W``. For a session built from memory, that
view must first be made contiguous (a copy of the weight) and ONNX Runtime then copies the
copy into its own buffer before it packs it for its GEMM: two fresh copies of every weight,
for each graph of a model (a decoder's prefill and decode graphs each get their own session).

ONNX Runtime's contrib op ``FusedMatMul`` with ``transB=1`` computes the same product from
``W`` itself, and its CPU kernel is ``MatMul``'s, packing ``W`` transposed into the same
packed matrix: so the session reads the model's contiguous weight by reference and neither
copy is made, and every result is the one ``MatMul`` gives (tested: equal bit for bit). The
written file keeps the standard ``MatMul`` for every other reader (TensorRT, OpenVINO, a later
load).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

__all__ = ["CONTRIB_DOMAIN", "read_transposed", "transposed_weights"]

CONTRIB_DOMAIN = "com.microsoft"
_STANDARD_DOMAINS = ("", "ai.onnx")


def transposed_weights(
    model: Any, weights: Mapping[str, torch.Tensor], min_bytes: int
) -> dict[str, torch.Tensor]:
    """``name -> W`` for each weight that is ``W.t()`` of a contiguous float32 ``W``, holds at
    least ``min_bytes``, and is read only as the second input of standard ``MatMul`` nodes
    (anything else reading it, a graph output or a subgraph, leaves it as it is)."""
    uses = _uses(model.graph)
    outputs = {value.name for value in model.graph.output}
    found = {}
    for name, tensor in weights.items():
        if tensor.dtype != torch.float32 or tensor.dim() != 2 or tensor.is_contiguous():
            continue
        if not tensor.t().is_contiguous() or tensor.numel() * 4 < min_bytes:
            continue
        readers = uses.get(name, [])
        if readers and name not in outputs and all(map(_reads_as_matmul_b, readers)):
            found[name] = tensor.t()
    return found


def read_transposed(model: Any, names: Collection[str]) -> int:
    """Make every ``MatMul`` whose second input is one of ``names`` a ``FusedMatMul`` that
    reads it transposed (``transB=1``), in place; the initializers named must then hold
    ``W`` rather than ``W.t()``.

    Returns:
        The number of nodes rewritten.
    """
    from onnx import helper

    rewritten = 0
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.domain in _STANDARD_DOMAINS and node.input[1] in names:
            node.op_type, node.domain = "FusedMatMul", CONTRIB_DOMAIN
            node.attribute.extend(
                [helper.make_attribute("transB", 1), helper.make_attribute("alpha", 1.0)]
            )
            rewritten += 1
    if rewritten and not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return rewritten


def _uses(graph: Any) -> dict[str, list[tuple[Any, int]]]:
    """Value name -> ``(node, input index)`` of each reader; a reader inside a subgraph (an
    ``If`` or ``Loop`` body) is recorded with index -1."""
    uses: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, index))
        for attribute in node.attribute:
            bodies = [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]
            for body in bodies:
                for name in _uses(body):
                    uses.setdefault(name, []).append((node, -1))
    return uses


def _reads_as_matmul_b(use: tuple[Any, int]) -> bool:
    node, index = use
    return node.op_type == "MatMul" and node.domain in _STANDARD_DOMAINS and index == 1
