"""Where two ONNX files put Q/DQ, node by node: the analysis behind the ``modelopt_agreement``
probe (a helper module of it, not a probe).

An input counts as *quantized* when a DequantizeLinear reaches it through data-movement ops
only (:data:`TRANSPARENT`: the ops TensorRT moves Q/DQ across). Inputs that are constants
(initialisers and what folds from them: biases, shape arithmetic) are not counted, except the
weight of Conv/Gemm/MatMul. Nodes are matched by name, after checking that each op type has as
many nodes in all three files (with the weight size of each matched Conv/Gemm/MatMul as a
cross-check), else by topological position within the op type. :func:`compare` returns the
agreement per op type and the differing node groups (the probe prints them).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

__all__ = ["Comparison", "Graph", "Row", "compare"]

# Ops TensorRT propagates Q/DQ across (data movement, no arithmetic): a DQ behind them still
# feeds the consumer. Cast: ModelOpt's fp16 output casts between DQ and the fp32 islands.
TRANSPARENT = {
    "Identity",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Split",
    "Slice",
    "Cast",
}
WEIGHTED = ("Conv", "Gemm", "MatMul")
MAIN_OPS = ("Conv", "Gemm", "MatMul", "Add")
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
# Shape arithmetic: static here (batch 1, static shapes), folded to constants by TensorRT.
SHAPE_OPS = ("Shape", "Size")


# ---------------------------------------------------------------------------------------------
# graph analysis
# ---------------------------------------------------------------------------------------------


class Graph:
    """An ONNX graph indexed for walking back from a node's inputs."""

    def __init__(self, path: Path) -> None:
        self.model = onnx.load(str(path), load_external_data=False)
        g = self.model.graph
        self.nodes = list(g.node)
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.initializers = {i.name: i for i in g.initializer}
        self.inputs = {i.name for i in g.input}
        self._const: dict[str, bool] = {}

    def is_const(self, tensor: str) -> bool:
        """Whether ``tensor`` is an initialiser or folds from initialisers / Constant nodes."""
        if tensor in self._const:
            return self._const[tensor]
        if tensor in self.initializers:
            result = True
        elif tensor in self.inputs or tensor not in self.producer:
            result = False
        else:
            node = self.producer[tensor]
            result = node.op_type in ("Constant", *SHAPE_OPS) or all(
                self.is_const(i) for i in node.input if i
            )
        self._const[tensor] = result
        return result

    def dq_behind(self, tensor: str) -> onnx.NodeProto | None:
        """The DequantizeLinear feeding ``tensor`` through transparent ops, or None."""
        seen = 0
        while tensor in self.producer and seen < 32:
            node = self.producer[tensor]
            if node.op_type == "DequantizeLinear":
                return node
            if node.op_type not in TRANSPARENT:
                return None
            tensor, seen = node.input[0], seen + 1
        return None

    def source(self, tensor: str) -> onnx.NodeProto | None:
        """The op computing ``tensor``, looking through Q/DQ and transparent ops."""
        for _ in range(64):
            node = self.producer.get(tensor)
            if node is None or not (node.op_type in QDQ_OPS or node.op_type in TRANSPARENT):
                return node
            tensor = node.input[0]
        return None

    def weight_numel(self, tensor: str) -> int:
        """Elements of the constant behind ``tensor`` (through DQ/Q/transparent ops)."""
        for _ in range(64):
            if tensor in self.initializers:
                return int(np.prod(self.initializers[tensor].dims))
            node = self.producer.get(tensor)
            if node is None:
                return -1
            if node.op_type == "Constant":
                return int(np.prod(node.attribute[0].t.dims))
            tensor = node.input[0]
        return -1

    def weight_axis_ok(self, node: onnx.NodeProto) -> bool | None:
        """Whether the weight of Conv/Gemm/MatMul ``node`` is quantized per output channel."""
        tensor, perm = node.input[1], None
        while tensor in self.producer:
            prod = self.producer[tensor]
            if prod.op_type == "DequantizeLinear":
                scale = self.initializers.get(prod.input[1])
                if scale is None or not scale.dims or int(np.prod(scale.dims)) == 1:
                    return False  # per tensor
                axis = next((a.i for a in prod.attribute if a.name == "axis"), 1)
                rank = len(self._shape_of(prod.input[0]) or []) or 2
                axis = axis % rank
                if perm is not None:
                    axis = list(perm).index(axis)
                if node.op_type == "Conv":
                    return axis == 0
                if node.op_type == "MatMul":
                    return axis == rank - 1
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                return axis == (0 if trans_b else 1)
            if prod.op_type == "Transpose":
                perm = next((list(a.ints) for a in prod.attribute if a.name == "perm"), None)
            elif prod.op_type not in TRANSPARENT:
                return None
            tensor = prod.input[0]
        return None

    def _shape_of(self, tensor: str) -> list[int] | None:
        if tensor in self.initializers:
            return list(self.initializers[tensor].dims)
        node = self.producer.get(tensor)
        if node is not None and node.op_type == "QuantizeLinear":
            return self._shape_of(node.input[0])
        return None


def counted_inputs(graph: Graph, node: onnx.NodeProto) -> list[int]:
    """The input positions compared: activations, plus the weight of Conv/Gemm/MatMul."""
    positions = []
    for i, tensor in enumerate(node.input):
        if not tensor:
            continue
        if node.op_type in ("Conv", "Gemm") and i >= 2:
            continue  # bias: never quantized by either (TensorRT computes it in float)
        if node.op_type in WEIGHTED and i == 1:
            positions.append(i)
        elif not graph.is_const(tensor):
            positions.append(i)
    return positions


def quantized_inputs(graph: Graph, node: onnx.NodeProto) -> set[int]:
    return {i for i, t in enumerate(node.input) if t and graph.dq_behind(t) is not None}


def describe_node(graph: Graph, node: onnx.NodeProto) -> str:
    """A short kind for grouping: 'residual Add', 'bias Add', 'weight MatMul', 'BMM MatMul'..."""
    op = node.op_type
    if op in ("MatMul", "Gemm"):
        return f"{'weight' if graph.is_const(node.input[1]) else 'activation x activation'} {op}"
    if op in ("Add", "Mul"):
        consts = [graph.is_const(t) for t in node.input]
        if any(consts):
            return f"{op} with a constant"
        return f"{op} of two activations"
    return op


def describe_input(graph: Graph, node: onnx.NodeProto, i: int) -> str:
    """What computes input ``i``: 'weight', 'MatMul+bias' (a linear), 'Add(residual)',
    'MatMul+bias*scale' (attention q / k), 'Softmax'..."""
    if node.op_type in WEIGHTED and i == 1 and graph.is_const(node.input[1]):
        return "weight"
    return _label(graph, node.input[i], 3)


def _label(graph: Graph, tensor: str, depth: int) -> str:
    src = graph.source(tensor)
    if src is None:
        return "model input" if tensor in graph.inputs else "const"
    if src.op_type in ("Add", "Mul") and depth > 0:
        variable = [t for t in src.input if not graph.is_const(t)]
        if len(variable) == 1:  # a bias add / a scale
            suffix = "+bias" if src.op_type == "Add" else "*scale"
            return _label(graph, variable[0], depth - 1) + suffix
        if src.op_type == "Add":
            return "Add(residual)"
    return src.op_type


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    op: str
    nodes: int = 0
    both: int = 0
    only_ours: int = 0
    only_modelopt: int = 0
    neither: int = 0

    @property
    def inputs(self) -> int:
        return self.both + self.only_ours + self.only_modelopt + self.neither

    @property
    def agreement(self) -> float:
        return 100.0 * (self.both + self.neither) / self.inputs if self.inputs else 100.0


@dataclass
class Comparison:
    model: str
    rows: list[Row] = field(default_factory=list)
    total: Row = field(default_factory=lambda: Row("all"))
    differences: list[dict[str, Any]] = field(default_factory=list)
    matching: str = ""
    op_counts: dict[str, list[int]] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)
    qdq_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _dq_one_op_earlier(graph: Graph, node: onnx.NodeProto, i: int) -> bool:
    """Whether input ``i`` is not DQ-fed but comes from a scale / bias op (one variable input,
    the rest constant) that reads a DQ: e.g. the ``q * scale`` between a DQ and a MatMul."""
    src = graph.source(node.input[i])
    if src is None or src.op_type not in ("Mul", "Div", "Add", "Sub"):
        return False
    variable = [t for t in src.input if t and not graph.is_const(t)]
    return len(variable) == 1 and graph.dq_behind(variable[0]) is not None


def _node_lists(graph: Graph, op: str) -> list[onnx.NodeProto]:
    return [n for n in graph.nodes if n.op_type == op]


def match_nodes(
    ref: Graph, ours: Graph, mo: Graph, ops: list[str]
) -> tuple[dict[str, list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]]], str]:
    """(float, ours, ModelOpt) node triples per op type, by name, else by topological order."""
    triples: dict[str, list] = {}
    how = set()
    for op in ops:
        lists = [_node_lists(g, op) for g in (ref, ours, mo)]
        if len({len(x) for x in lists}) != 1:
            raise SystemExit(
                f"{op}: {[len(x) for x in lists]} nodes in float / ours / ModelOpt: the files do "
                "not have the same ops, matching is not possible"
            )
        by_name = [{n.name: n for n in x} for x in lists]
        if all(n.name in by_name[1] and n.name in by_name[2] for n in lists[0]):
            triples[op] = [(n, by_name[1][n.name], by_name[2][n.name]) for n in lists[0]]
            how.add("name")
        else:
            triples[op] = list(zip(*lists))
            how.add("topological order")
        if op in WEIGHTED:  # cross-check: the same weight size on all three sides
            for f, o, m in triples[op]:
                sizes = {
                    ref.weight_numel(f.input[1]),
                    ours.weight_numel(o.input[1]),
                    mo.weight_numel(m.input[1]),
                }
                if len(sizes) != 1 and ref.is_const(f.input[1]):
                    raise SystemExit(f"{op} {f.name}: weight sizes differ {sizes}: bad match")
    return triples, " and ".join(sorted(how))


def compare(model: str, ref_path: Path, ours_path: Path, mo_path: Path) -> Comparison:
    """Where ours and ModelOpt put Q/DQ on the float file's nodes, op type by op type."""
    ref, ours, mo = Graph(ref_path), Graph(ours_path), Graph(mo_path)
    result = Comparison(model)
    for name, g in (("ours", ours), ("modelopt", mo)):
        c = Counter(n.op_type for n in g.nodes)
        result.qdq_counts[name] = {"Q": c["QuantizeLinear"], "DQ": c["DequantizeLinear"]}
    # op types to tabulate: the main four, plus any other op reading a DQ'd activation
    extra = set()
    for g in (ours, mo):
        for n in g.nodes:
            if n.op_type in (*MAIN_OPS, *QDQ_OPS, *TRANSPARENT, *SHAPE_OPS):
                continue
            if any(i in quantized_inputs(g, n) for i in counted_inputs(g, n)):
                extra.add(n.op_type)
    ops = [*MAIN_OPS, *sorted(extra)]
    ops = [op for op in ops if _node_lists(ref, op)]
    for op in ops:
        result.op_counts[op] = [len(_node_lists(g, op)) for g in (ref, ours, mo)]
    triples, result.matching = match_nodes(ref, ours, mo, ops)

    groups: dict[tuple, list[str]] = defaultdict(list)
    weight_axis = {"ours": [0, 0], "modelopt": [0, 0]}  # per output channel, weights quantized
    for op in ops:
        row = Row(op)
        for f, o, m in triples[op]:
            positions = counted_inputs(ref, f)
            if not positions:
                continue
            row.nodes += 1
            q_ours, q_mo = quantized_inputs(ours, o), quantized_inputs(mo, m)
            for i in positions:
                a, b = i in q_ours, i in q_mo
                if a and b:
                    row.both += 1
                elif a:
                    row.only_ours += 1
                elif b:
                    row.only_modelopt += 1
                else:
                    row.neither += 1
            if op in WEIGHTED and ref.is_const(f.input[1]):
                for side, g, n, q in (("ours", ours, o, q_ours), ("modelopt", mo, m, q_mo)):
                    if 1 in q:
                        weight_axis[side][1] += 1
                        weight_axis[side][0] += bool(g.weight_axis_ok(n))
            ours_set = tuple(sorted(i for i in positions if i in q_ours))
            mo_set = tuple(sorted(i for i in positions if i in q_mo))
            if ours_set != mo_set:
                inputs = tuple(describe_input(ref, f, i) for i in positions)
                earlier = tuple(
                    tuple(i for i in positions if i not in q and _dq_one_op_earlier(g, n, i))
                    for g, n, q in ((ours, o, q_ours), (mo, m, q_mo))
                )
                key = (describe_node(ref, f), inputs, tuple(positions), ours_set, mo_set, earlier)
                groups[key].append(f.name)
        result.rows.append(row)
        for attr in ("nodes", "both", "only_ours", "only_modelopt", "neither"):
            setattr(result.total, attr, getattr(result.total, attr) + getattr(row, attr))
    for side, (ok, total) in weight_axis.items():
        result.weights[side] = f"{ok}/{total} quantized weights per output channel"
    result.differences = _differences(groups)
    return result


def _differences(groups: dict[tuple, list[str]]) -> list[dict[str, Any]]:
    """The differing node groups, most nodes first, as the report lists them."""

    def names(positions, inputs, chosen):
        if not chosen:
            return "none"
        return ", ".join(f"#{i} ({inputs[positions.index(i)]})" for i in chosen)

    found = []
    for (kind, inputs, positions, o_set, m_set, earlier), nodes in sorted(
        groups.items(), key=lambda kv: -len(kv[1])
    ):
        found.append(
            {
                "count": len(nodes),
                "kind": kind,
                "inputs": [f"#{i} {d}" for i, d in zip(positions, inputs)],
                "ours": names(positions, inputs, o_set),
                "modelopt": names(positions, inputs, m_set),
                "ours_dq_one_op_earlier": [f"#{i}" for i in earlier[0]],
                "modelopt_dq_one_op_earlier": [f"#{i}" for i in earlier[1]],
                "examples": nodes[:3],
            }
        )
    return found
