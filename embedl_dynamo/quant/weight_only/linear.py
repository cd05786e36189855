"""Weight-only int8 / int4 precisions: the linear layers' weights in integers, activations float.

The precision decoder LLMs are deployed in (torchao ``Int8WeightOnlyConfig`` /
``Int4WeightOnlyConfig(group_size)``, NNCF ``compress_weights``). Every fused linear with a
constant weight ``W [N, K]`` gets integer codes ``q``, scales ``s`` and, when asymmetric, zero
points ``z``: per output channel for 8 bits, per group of ``g`` consecutive input features for
4 bits (``g = weight_only_group_size``)::

    symmetric:   s = max|W| / qmax,        q = clip(round(W / s), -qmax, qmax),   z = 0
    asymmetric:  s = (max(W, 0) - min(W, 0)) / (2**bits - 1),  z = round(-min(W, 0) / s),
                 q = clip(round(W / s) + z, 0, 2**bits - 1)
    W' = (q - z) * s                      (qmax = 7 for int4, 127 for int8: a narrow range)

The layer becomes a :class:`WeightOnlyLinear`, which computes with ``W'`` (so PyTorch, the
accuracy judge and every runtime see the same numbers) and keeps only ``q``, ``s`` and ``z``
(``W'`` is dequantized when used), for the ONNX writer (:mod:`embedl_dynamo.onnx.weight_only`), which stores them as integer
initializers read by ``DequantizeLinear`` in front of the ``MatMul``; ONNX Runtime fuses that
into ``MatMulNBits`` and OpenVINO into a compressed-weight matmul.

Which layers keep 8 bits under ``int4_weight_only`` (each one reported with its reason):

* a layer whose input features are not a multiple of the group size;
* the last linear layer (an LM's output head) when no ``accuracy_budget`` is given (a direct
  call; the pipeline always has one), as NNCF does by default: its error reaches the logits
  directly. With a budget the head is tried in int4 like every layer (on a 0.5B LLM it is a
  quarter of the weights a token reads);
* while the int4 graph's outputs on the example inputs fall below ``accuracy_budget`` (cosine
  to the float graph), first the output head, then the layers with the largest relative int4
  weight error, doubling the count each step, until the outputs are within the budget (or
  every layer has 8 bits).

Embedding tables become per-row int8 codes under both precisions
(:mod:`embedl_dynamo.quant.weight_only.embedding`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.nodes import constant_value, module_path
from embedl_dynamo.patterns.fused_modules import FusedLinear
from embedl_dynamo.quant.weight_only.codes import (
    WeightOnlySpec,
    dequantize_weight,
    dequantize_weight_t,
    quantize_weight,
)
from embedl_dynamo.quant.weight_only.embedding import (
    WeightOnlyEmbedding,
    embedding_tables,
    swap_embeddings,
)

__all__ = [
    "WEIGHT_ONLY_BITS",
    "WeightOnlyLinear",
    "apply_activation",
    "dense_weights",
    "weight_only_graph",
]

# precision name -> bits of its linear layers' weights
WEIGHT_ONLY_BITS = {"int8_weight_only": 8, "int4_weight_only": 4}

# the fused modules' activations by name (FusedLinear keeps its table private)
_ACTIVATIONS = {
    "relu": torch.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def apply_activation(name: str | None, y: torch.Tensor) -> torch.Tensor:
    """``y`` through the fused modules' activation ``name`` (None: ``y`` itself)."""
    return y if name is None else _ACTIVATIONS[name](y)


class WeightOnlyLinear(nn.Module):
    """``act(x @ W'.T + b)`` with ``W'`` dequantized from integer codes (see the module).

    The layer keeps only ``codes``, ``scale`` and ``zero_point`` (a quarter or an eighth of the
    float weight) and dequantizes ``W'`` in ``forward``: the float weight of an LLM would
    otherwise live beside its codes in every compiled graph. While :func:`dense_weights` holds
    it, the layer has a ``weight_t`` buffer (``W'.T``, ``[K, N]``) and multiplies by that, so an
    ONNX exporter writes one ``MatMul`` with a constant weight, which the ONNX writer
    (:mod:`embedl_dynamo.onnx.weight_only`) replaces by ``DequantizeLinear`` of ``codes``.
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        zero_point: torch.Tensor | None,
        bias: torch.Tensor | None,
        spec: WeightOnlySpec,
        *,
        kind: str,
        activation: str | None,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.kind = kind
        self.activation = activation
        self.dtype = dtype
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("zero_point", zero_point)
        self.register_buffer("bias", bias)

    @classmethod
    def quantized(cls, linear: FusedLinear, spec: WeightOnlySpec) -> WeightOnlyLinear:
        """``linear``'s weight quantized under ``spec`` (its bias copied, kept float)."""
        q, scale, zero = quantize_weight(linear.weight, spec)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(
            q,
            scale,
            zero,
            bias,
            spec,
            kind=linear.kind,
            activation=linear.activation,
            dtype=linear.weight.dtype,
        )

    def dense_weight_t(self) -> torch.Tensor:
        """``W'.T`` (``[K, N]``, the float weight's dtype): the ``weight_t`` buffer while
        :func:`dense_weights` holds it, else dequantized now (a transposed view)."""
        held = self._buffers.get("weight_t")
        if held is not None:
            return held
        return dequantize_weight(self.codes, self.scale, self.zero_point).to(self.dtype).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.dense_weight_t())
        if self.bias is not None:
            y = y + self.bias
        return apply_activation(self.activation, y)

    def extra_repr(self) -> str:
        n, k = self.codes.shape
        sym = "sym" if self.spec.symmetric else "asym"
        group = f", group={self.spec.group_size}" if self.spec.bits == 4 else ""
        return f"{k}->{n}, int{self.spec.bits} {sym}{group}"


@contextlib.contextmanager
def dense_weights(gm: nn.Module) -> Iterator[list[WeightOnlyLinear]]:
    """Give every :class:`WeightOnlyLinear` of ``gm`` its ``weight_t`` buffer (``W'.T``,
    contiguous) while the block runs, for an ONNX exporter to write as a ``MatMul`` constant;
    the buffers are removed on exit, so the float weights live only as long as the export.

    Yields:
        The weight-only layers of ``gm`` (none: an ordinary graph, nothing added).
    """
    layers = [m for m in gm.modules() if isinstance(m, WeightOnlyLinear)]
    added = [m for m in layers if m._buffers.get("weight_t") is None]
    for layer in added:
        weight_t = dequantize_weight_t(layer.codes, layer.scale, layer.zero_point)
        layer.register_buffer("weight_t", weight_t.to(layer.dtype))
    try:
        yield layers
    finally:
        for layer in added:
            layer._buffers.pop("weight_t", None)


def _linears(gm: fx.GraphModule) -> list[fx.Node]:
    modules = dict(gm.named_modules())
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(modules.get(n.target), FusedLinear)
    ]


def weight_only_graph(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    spec: WeightOnlySpec,
    accuracy_budget: float | None = None,
    tables_kept: str | None = None,
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """A copy of ``gm`` with every fused linear weight-only quantized under ``spec``.

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder (for the int4 budget check).
        spec: bits, group size, symmetry.
        accuracy_budget: the least cosine of the outputs to the float graph's (int4 only;
            None: no check).
        tables_kept: why every embedding table stays float on this target (None: tables
            become int8, :mod:`~embedl_dynamo.quant.weight_only.embedding`).

    Returns:
        ``(graph, report)``: ``layers`` (id, precision, reason), ``bits``, ``group_size``,
        ``symmetric``, ``kept_int8`` (ids the budget kept at 8 bits) and ``cosine`` (None
        unchecked).
    """
    nodes = _linears(gm)
    ids = {n: f"{gm.get_submodule(n.target).kind}@{module_path(n) or n.name}" for n in nodes}
    int8 = WeightOnlySpec(8, spec.group_size, spec.symmetric)
    reasons: dict[fx.Node, str] = {}
    if spec.bits == 4:
        for node in nodes:
            k = gm.get_submodule(node.target).weight.shape[1]
            if k % spec.group_size:
                reasons[node] = f"in_features {k} is not a multiple of group size {spec.group_size}"
        if nodes and nodes[-1] not in reasons and accuracy_budget is None:
            reasons[nodes[-1]] = (
                "last linear (output head) keeps 8 bits without an accuracy_budget, as NNCF's "
                "default"
            )
    made: dict[tuple[fx.Node, int], WeightOnlyLinear] = {}
    tables, embedding_rows = embedding_tables(gm, tables_kept)
    built = _build(gm, nodes, spec, int8, reasons, made, tables)
    kept: list[str] = []
    cosine = None
    if spec.bits == 4 and accuracy_budget is not None:
        built, kept, cosine = _within_budget(
            gm, example_inputs, nodes, spec, int8, reasons, accuracy_budget, built, made, tables
        )
    layers = list(embedding_rows)
    for node in nodes:
        bits = 8 if spec.bits == 8 or node in reasons else 4
        why = reasons.get(node, f"weight-only int{spec.bits}: integer weights, float activations")
        layers.append({"id": ids[node], "precision": f"int{bits}_weight_only", "reason": why})
    report = {
        "layers": layers,
        "bits": spec.bits,
        "group_size": spec.group_size,
        "symmetric": spec.symmetric,
        "kept_int8": kept,
        "cosine": cosine,
    }
    return built, report


def _build(
    gm: fx.GraphModule,
    nodes: list[fx.Node],
    spec: WeightOnlySpec,
    int8: WeightOnlySpec,
    reasons: dict[fx.Node, str],
    made: dict[tuple[fx.Node, int], WeightOnlyLinear],
    tables: dict[str, WeightOnlyEmbedding],
) -> fx.GraphModule:
    """A copy of ``gm`` with each linear's weight-only layer, quantized once per node and bits
    (``made``): the budget's next attempt reuses every layer it does not change; and each
    embedding lookup in ``tables`` reading its int8 table."""
    out = copy.deepcopy(gm, _shared_constants(gm, nodes))
    for node in nodes:
        chosen = int8 if node in reasons else spec
        layer = made.get((node, chosen.bits))
        if layer is None:
            layer = made[node, chosen.bits] = WeightOnlyLinear.quantized(
                gm.get_submodule(node.target), chosen
            )
        owner, _, name = str(node.target).rpartition(".")
        setattr(out.get_submodule(owner) if owner else out, name, layer)
    swap_embeddings(out, tables)
    out.recompile()
    return out


def _shared_constants(gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[int, Any]:
    """A ``deepcopy`` memo that shares, rather than copies, the replaced linears' tensors and
    the constants no node writes in place: with an LLM's embedding table, a copy of every
    weight would double the compile's memory for nothing (constants are never changed)."""
    shared: list[torch.Tensor] = []
    for node in nodes:
        linear = gm.get_submodule(node.target)
        shared.extend([*linear.parameters(), *linear.buffers()])
    for node in gm.graph.nodes:
        if node.op == "get_attr" and not any(_writes(user) for user in node.users):
            value = constant_value(gm, node)
            if isinstance(value, torch.Tensor):
                shared.append(value)
    return {id(t): t for t in shared}


def _writes(node: fx.Node) -> bool:
    """Whether ``node`` may write into its inputs (an in-place op, ``setitem``, ``copy_``)."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return str(name).endswith("_") or name in ("setitem", "index_put") or node.op == "call_module"


def _cosine(a: Any, b: Any) -> float:
    """The least cosine similarity between matching float outputs of ``a`` and ``b``."""
    worst = 1.0
    for x, y in zip(_tensors(a), _tensors(b)):
        if x.numel():
            x, y = x.detach().double().flatten(), y.detach().double().flatten()
            worst = min(worst, float(F.cosine_similarity(x, y, dim=0, eps=1e-12)))
    return worst


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _within_budget(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    nodes: list[fx.Node],
    spec: WeightOnlySpec,
    int8: WeightOnlySpec,
    reasons: dict[fx.Node, str],
    budget: float,
    built: fx.GraphModule,
    made: dict[tuple[fx.Node, int], WeightOnlyLinear],
    tables: dict[str, WeightOnlyEmbedding],
) -> tuple[fx.GraphModule, list[str], float]:
    """Keep the most int4-sensitive layers at 8 bits until the outputs meet ``budget``: the
    output head first (its error reaches the logits directly), then by weight error. Each
    attempt quantizes only the layers it moves to 8 bits (``made`` holds the others)."""
    with torch.no_grad():
        reference = gm(*example_inputs)
        cosine = _cosine(built(*example_inputs), reference)
    candidates = [n for n in nodes if n not in reasons]

    def error(node: fx.Node) -> float:
        w = gm.get_submodule(node.target).weight.detach().float()
        layer = made[node, spec.bits]  # built above: every candidate has 4 bits
        q = dequantize_weight(layer.codes, layer.scale, layer.zero_point)
        return float(q.sub_(w).norm() / w.norm().clamp_min(1e-12))

    head = nodes[-1] if nodes else None
    if cosine < budget:  # ranked only when needed: each error dequantizes a layer
        candidates.sort(key=error, reverse=True)
        if head in candidates:
            candidates.remove(head)
            candidates.insert(0, head)
    kept: list[str] = []
    count = 1
    while cosine < budget and candidates:
        chosen, candidates = candidates[:count], candidates[count:]
        for node in chosen:
            which = "the output head" if node is head else "largest int4 weight error"
            reasons[node] = (
                f"accuracy_budget: int4 outputs' cosine {cosine:.4f} < {budget}; "
                f"{which} keeps 8 bits"
            )
            kept.append(f"{gm.get_submodule(node.target).kind}@{module_path(node) or node.name}")
        built = _build(gm, nodes, spec, int8, reasons, made, tables)
        with torch.no_grad():
            cosine = _cosine(built(*example_inputs), reference)
        count *= 2
    return built, kept, cosine
