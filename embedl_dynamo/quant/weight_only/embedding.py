"""Weight-only embedding tables: 8-bit codes per row, looked up, then scaled.

A decoder LLM's token embedding is a large table of which each call reads only the rows of its
tokens. Under a weight-only precision its float table would still be written whole into every
file the model compiles to (prefill, decode step, the dynamic recompile), loaded into every
session and hashed at every start. So each lookup ``F.embedding(ids, W)`` of a constant float
table ``W [V, D]`` becomes a :class:`WeightOnlyEmbedding`: codes ``q`` int8 ``[V, D]`` and a
scale ``s`` float32 ``[V, 1]`` per row, symmetric (``s = max|row| / 127``,
``q = clip(round(row / s), -127, 127)``), which computes::

    q[ids].to(float32) * s[ids]        (then the table's dtype)

the rows ``W'[ids]`` of ``W' = q * s`` exactly, since scaling a row commutes with gathering
it. An ONNX exporter writes ``Gather`` of the int8 table, ``Cast``, and ``Mul`` by ``Gather`` of
the scales: ops every runtime runs, with the table stored and held in 8 bits. Under
``int4_weight_only`` the table keeps 8 bits too, as NNCF does by default for embeddings: a
lookup reads a row, not the table, so 4 bits would save memory but no time.

Not rewritten, each with its reason: every lookup on the ``tensorrt`` target (its int8
constants are read through ``DequantizeLinear``; the stage says so), a lookup with
``max_norm`` (it renormalises the table's rows in place), a table that is not a 2-d
floating-point constant of the graph, one the graph writes in place, or one it also reads
outside lookups (an output head tied to the table as a plain matmul: the file would hold the
table twice).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.aliasing import mutated_tensor
from embedl_dynamo.graph.nodes import constant_value, module_path
from embedl_dynamo.quant.weight_only.codes import WeightOnlySpec, dequantize_weight, quantize_weight

__all__ = ["WeightOnlyEmbedding", "embedding_tables", "swap_embeddings"]

_INT8_ROWS = WeightOnlySpec(8, 128, True)  # 8 bits per row: the group is the whole row


class WeightOnlyEmbedding(nn.Module):
    """``q[ids] * s[ids]`` in the table's dtype: an embedding lookup of a table kept as
    per-row int8 codes (see the module)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)

    @classmethod
    def quantized(cls, table: torch.Tensor) -> WeightOnlyEmbedding:
        """``table`` (``[V, D]``, floating point) as per-row symmetric int8 codes."""
        codes, scale, _ = quantize_weight(table, _INT8_ROWS)
        return cls(codes, scale, table.dtype)

    def dense_table(self) -> torch.Tensor:
        """``W' = q * s`` (float32 ``[V, D]``), the table this lookup reads rows of."""
        return dequantize_weight(self.codes, self.scale, None)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.codes).to(torch.float32) * F.embedding(ids, self.scale)
        return rows.to(self.dtype)

    def extra_repr(self) -> str:
        v, d = self.codes.shape
        return f"{v}x{d}, int8 sym per row"


def _table(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    value = constant_value(gm, _table_node(node))
    return value if isinstance(value, torch.Tensor) else None


def _table_node(node: fx.Node) -> Any:
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")


def _written_attributes(gm: fx.GraphModule) -> set[Any]:
    """The targets of the ``get_attr`` nodes some node of ``gm`` writes into in place."""
    written = (mutated_tensor(node) for node in gm.graph.nodes)
    return {t.target for t in written if isinstance(t, fx.Node) and t.op == "get_attr"}


def _read_elsewhere(gm: fx.GraphModule, target: Any) -> bool:
    """Whether a node other than an ``F.embedding`` lookup of it reads the table ``target``."""
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target != target:
            continue
        for user in node.users:
            lookup = user.op == "call_function" and user.target is F.embedding
            if not lookup or _table_node(user) is not node:
                return True
    return False


def _refusal(gm: fx.GraphModule, node: fx.Node, written: set[Any]) -> str | None:
    """Why the lookup ``node`` keeps its float table (None: it is rewritten); ``written``: the
    constants the graph writes in place (:func:`_written_attributes`)."""
    max_norm = node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")
    if max_norm is not None:
        return "max_norm renormalises the table's rows in place"
    table = _table(gm, node)
    if table is None:
        return "the table is not a constant of the graph"
    if table.dim() != 2 or not table.is_floating_point() or table.device.type == "meta":
        return f"the table is not a 2-d floating-point tensor ({table.dtype}, {table.dim()}-d)"
    if _table_node(node).target in written:
        return "the graph writes into the table"
    if _read_elsewhere(gm, _table_node(node).target):
        return "the graph also reads the table outside lookups (both would be stored)"
    return None


def embedding_tables(
    gm: fx.GraphModule, kept: str | None = None
) -> tuple[dict[str, WeightOnlyEmbedding], list[dict[str, str]]]:
    """The int8 lookup of each ``F.embedding`` of ``gm`` that takes one, by node name (a table
    two lookups share is quantized once), and the report's rows: each lookup's precision and
    reason (a refused one keeps its float table). ``kept``: why every table stays float (the
    target's reason), or None."""
    tables: dict[str, WeightOnlyEmbedding] = {}
    by_table: dict[int, WeightOnlyEmbedding] = {}
    rows = []
    written = _written_attributes(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not F.embedding:
            continue
        layer = f"embedding@{module_path(node) or node.name}"
        reason = kept or _refusal(gm, node, written)
        if reason is not None:
            why = f"the embedding keeps its float table: {reason}"
            rows.append({"id": layer, "precision": "fp32", "reason": why})
            continue
        table = _table(gm, node)
        if id(table) not in by_table:
            by_table[id(table)] = WeightOnlyEmbedding.quantized(table)
        tables[node.name] = by_table[id(table)]
        why = "embedding table: int8 codes per row, looked up then scaled (NNCF's default)"
        rows.append({"id": layer, "precision": "int8_weight_only", "reason": why})
    return tables, rows


def swap_embeddings(out: fx.GraphModule, tables: dict[str, WeightOnlyEmbedding]) -> None:
    """In ``out`` (a copy of the graph the lookups were found in, same node names), call
    ``tables[name]`` for each lookup named ``name`` (a submodule named after its table:
    ``<table>_int8``), and drop the float tables left unused."""
    names: dict[int, str] = {}
    old_tables = set()
    for node in list(out.graph.nodes):
        module = tables.get(node.name)
        if module is None:
            continue
        table_node = _table_node(node)
        if id(module) not in names:
            name = str(table_node.target).replace(".", "_") + "_int8"
            while hasattr(out, name):
                name += "_"
            out.add_submodule(name, module)
            names[id(module)] = name
        ids = node.args[0] if node.args else node.kwargs["input"]
        with out.graph.inserting_before(node):
            lookup = out.graph.call_module(names[id(module)], (ids,))
        lookup.meta = dict(node.meta)
        node.replace_all_uses_with(lookup)
        out.graph.erase_node(node)
        old_tables.add(table_node)
    for table_node in old_tables:
        if not table_node.users:
            _drop_table(out, table_node)


def _drop_table(out: fx.GraphModule, table_node: fx.Node) -> None:
    """Erase the unused ``get_attr`` of a float table, and the table where nothing reads it."""
    target = str(table_node.target)
    out.graph.erase_node(table_node)
    if not any(n.op == "get_attr" and n.target == target for n in out.graph.nodes):
        owner, _, attr = target.rpartition(".")
        holder = out.get_submodule(owner) if owner else out
        if hasattr(holder, attr):
            delattr(holder, attr)
