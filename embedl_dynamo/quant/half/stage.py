"""FP16 / BF16 in the graph: matmul-class layers in half precision, the sensitive rest in FP32.

:func:`cast_graph` rewrites a fused, canonical graph so the dtype decision is part of the graph
(and so of the ONNX file or TensorRT engine built from it; TensorRT 11 networks are strongly
typed, so FP16 has to live in the network's own types, not in a builder flag):

* **half**: convolutions, linears and matmuls (fused modules with a weight, ``F.linear``,
  ``torch.matmul``/``bmm``/``addmm``/``baddbmm``, scaled-dot-product attention), whose
  accumulations TensorRT and cuDNN keep in FP32 anyway; their weights are stored in half;
* **fp32**: normalisation (LayerNorm/GroupNorm/BatchNorm statistics), softmax, reductions
  (mean/sum/var/norm, global average pooling), exp/log/pow, and every layer that produces a
  graph output (the logits), as PyTorch's autocast op lists and NVIDIA's mixed-precision
  guidance keep them;
* everything else follows its inputs (PyTorch's type promotion: half + fp32 is fp32).

An attention (scaled-dot-product attention, :class:`FusedAttention`, :class:`AttentionProbs`)
is one decision for q, k and v: they are cast together (SDPA refuses mixed dtypes), while a
fused attention's float mask is left to the module, which clamps it to the heads' range first.

Casts (``x.to(dtype)``, ONNX ``Cast``) are inserted only where a value changes precision, once
per value and dtype, and the graph's outputs are cast back to their original dtype, so callers
see the dtypes they always saw. Each decided layer gets a record (id, precision, reason).
"""

from __future__ import annotations

import copy
import operator
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from embedl_dynamo.graph.nodes import module_path
from embedl_dynamo.patterns.attention import AttentionProbs, FusedAttention
from embedl_dynamo.precision import Precision, get_precision
from embedl_dynamo.settings import Settings

__all__ = [
    "FP32_FUNCTIONS",
    "FP32_METHODS",
    "HALF_FUNCTIONS",
    "HALF_PRECISION_META",
    "cast_graph",
    "half_stage",
]

# ``gm.meta`` key of a cast graph: its precision (``fp16``/``bf16``)
HALF_PRECISION_META = "embedl_half_precision"

HALF_FUNCTIONS = frozenset(
    {
        F.linear,
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.matmul,
        torch.bmm,
        torch.mm,
        torch.addmm,
        torch.baddbmm,
        F.scaled_dot_product_attention,
    }
)
FP32_FUNCTIONS = frozenset(
    {
        F.layer_norm,
        F.group_norm,
        F.batch_norm,
        F.instance_norm,
        F.rms_norm,
        torch.rms_norm,
        F.normalize,
        torch.softmax,
        F.softmax,
        torch.log_softmax,
        F.log_softmax,
        torch.mean,
        torch.sum,
        torch.var,
        torch.std,
        torch.norm,
        torch.cumsum,
        torch.logsumexp,
        torch.exp,
        torch.log,
        torch.pow,
        torch.rsqrt,
        F.adaptive_avg_pool1d,
        F.adaptive_avg_pool2d,
        F.adaptive_avg_pool3d,
    }
)
FP32_METHODS = frozenset(
    {"softmax", "log_softmax", "mean", "sum", "var", "std", "norm", "exp", "log", "pow", "rsqrt"}
)


# fused attention type -> how many leading inputs (q, k[, v]) take the attention's one dtype
_ATTENTION_OPERANDS = {FusedAttention: 3, AttentionProbs: 2}


def _is_float(node: Any) -> bool:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return meta is not None and hasattr(meta, "dtype") and meta.dtype.is_floating_point


def _has_matrix_weight(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.is_floating_point() and weight.dim() >= 2


def _layer_id(node: fx.Node, module: Any) -> str:
    kind = getattr(module, "kind", None) if module is not None else None
    name = kind or (node.target if isinstance(node.target, str) else node.target.__name__)
    return f"{name}@{module_path(node) or node.name}"


def half_stage(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Any, settings: Settings
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The pipeline's stage of a precision with a half dtype (``fp16``/``bf16``).

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder.
        backend: the target (unused: the cast does not depend on it).
        settings: the settings; ``precision`` gives the half dtype.

    Returns:
        ``(cast graph, report entries)``: ``layers`` (see :func:`cast_graph`) and ``cast_s``.
    """
    start = time.perf_counter()
    model, layers = cast_graph(gm, list(example_inputs), settings.precision)
    return model, {"layers": layers, "cast_s": round(time.perf_counter() - start, 4)}


def cast_graph(
    gm: fx.GraphModule, example_inputs: list[Any], precision: str | Precision
) -> tuple[fx.GraphModule, list[dict[str, str]]]:
    """A copy of ``gm`` computing in ``precision``'s half dtype where that is safe.

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder (dtypes are propagated from them).
        precision: a precision with a half dtype (``fp16``, ``bf16``), or its name.

    Returns:
        ``(graph, layers)``: the cast graph, and one record per decided layer with ``id``,
        ``precision`` and ``reason``.

    Raises:
        ValueError: ``precision`` has no half dtype.
    """
    precision = get_precision(precision)
    half = precision.half_dtype
    if half is None:
        raise ValueError(
            f"cast_graph: precision {precision.name!r} has no half dtype; give one that has "
            "(fp16, bf16)"
        )
    gm = copy.deepcopy(gm)
    ShapeProp(gm).propagate(*example_inputs)
    casting = _HalfCast(gm, half, precision.name)
    for node in list(gm.graph.nodes):
        casting.visit(node)
    casting.restore_outputs()
    gm.graph.lint()
    gm.recompile()
    gm.meta[HALF_PRECISION_META] = precision.name
    return gm, casting.layers


class _HalfCast:
    """One pass of :func:`cast_graph`: each node's dtype in the cast graph, the casts made
    (one per value and dtype), and the layer records."""

    def __init__(self, gm: fx.GraphModule, half: torch.dtype, name: str) -> None:
        self.gm, self.half, self.name = gm, half, name
        self.modules = dict(gm.named_modules())
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.feeds_output = set(self.output.all_input_nodes)
        self.dtype_of: dict[fx.Node, torch.dtype] = {}  # float nodes' dtype in the cast graph
        self.casts: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}
        self.layers: list[dict[str, str]] = []

    def cast(self, value: Any, dtype: torch.dtype, before: fx.Node) -> Any:
        """``value`` in ``dtype``: a constant converted once where every user wants ``dtype``,
        else a ``to`` node before ``before`` (shared by every reader)."""
        dtype_of = self.dtype_of
        if not isinstance(value, fx.Node) or value not in dtype_of or dtype_of[value] == dtype:
            return value
        if value.op == "get_attr" and all(self.decision(u)[0] == dtype for u in value.users):
            tensor = operator.attrgetter(str(value.target))(self.gm)
            _set_attr(self.gm, str(value.target), tensor.to(dtype))
            dtype_of[value] = dtype
            return value
        if (value, dtype) not in self.casts:
            with self.gm.graph.inserting_before(before):
                node = self.gm.graph.call_method("to", (value, dtype))
            node.meta = {**value.meta, "embedl_cast": str(dtype)}
            self.casts[(value, dtype)] = node
        return self.casts[(value, dtype)]

    def decision(self, node: fx.Node) -> tuple[torch.dtype | None, str]:
        """The dtype ``node`` computes in and why; None where it follows its inputs."""
        module = self.modules.get(node.target) if node.op == "call_module" else None
        statistics = "normalisation, softmax or reduction: fp32 statistics"
        if node.op == "call_module" and _has_matrix_weight(module):
            kind = self.half
        elif node.op == "call_module" and type(module) in _ATTENTION_OPERANDS:
            kind = self.half
        elif node.op == "call_function" and node.target in HALF_FUNCTIONS:
            kind = self.half
        elif node.op == "call_function" and node.target in FP32_FUNCTIONS:
            return torch.float32, statistics
        elif node.op == "call_method" and node.target in FP32_METHODS:
            return torch.float32, statistics
        elif node.op == "call_module" and "Norm" in type(module).__name__:
            return torch.float32, statistics
        elif node.op == "call_module" and "Pool" in type(module).__name__:
            return torch.float32, "global pooling is a reduction: fp32"
        else:
            return None, ""
        if node in self.feeds_output:
            return torch.float32, "produces a graph output (logits stay fp32)"
        return kind, f"matmul-class layer: {self.name} compute, fp32 accumulation"

    def visit(self, node: fx.Node) -> None:
        """Decide ``node``'s dtype, cast its inputs to it, and record a decided layer."""
        if node.op in ("placeholder", "get_attr"):
            if _is_float(node):
                self.dtype_of[node] = node.meta["tensor_meta"].dtype
            return
        if node.op == "output" or node.meta.get("embedl_cast"):
            return
        dtype, reason = self.decision(node)
        if dtype is not None and _is_float(node):
            module = self.modules.get(node.target) if node.op == "call_module" else None
            self.cast_inputs(node, module, dtype)
            if module is not None and dtype == self.half:
                _set_attr(self.gm, str(node.target), copy.deepcopy(module).to(self.half))
            self.dtype_of[node] = dtype
            name = "fp32" if dtype == torch.float32 else self.name
            self.layers.append({"id": _layer_id(node, module), "precision": name, "reason": reason})
        elif _is_float(node):
            inputs = [self.dtype_of[a] for a in node.all_input_nodes if a in self.dtype_of]
            half = torch.float32 not in inputs and inputs
            self.dtype_of[node] = self.half if half else torch.float32

    def cast_inputs(self, node: fx.Node, module: Any, dtype: torch.dtype) -> None:
        """Cast ``node``'s inputs to ``dtype``: all of them, or a fused attention's q, k, v
        (its mask stays as it is: the module clamps a float mask to the heads' range)."""
        operands = _ATTENTION_OPERANDS.get(type(module), len(node.args))
        head = fx.node.map_arg(node.args[:operands], lambda a: self.cast(a, dtype, node))
        node.args = tuple(head) + tuple(node.args[operands:])
        node.kwargs = fx.node.map_arg(node.kwargs, lambda a: self.cast(a, dtype, node))

    def restore_outputs(self) -> None:
        """Cast every output back to the dtype the float graph returned."""

        def restore(value: Any) -> Any:
            if isinstance(value, fx.Node) and value in self.dtype_of:
                return self.cast(value, value.meta["tensor_meta"].dtype, self.output)
            return value

        self.output.args = fx.node.map_arg(self.output.args, restore)


def _set_attr(gm: fx.GraphModule, target: str, value: Any) -> None:
    owner_path, _, name = target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        if name in owner._buffers:
            owner._buffers[name] = value
            return
        if name in owner._parameters:
            owner._parameters[name] = torch.nn.Parameter(value, requires_grad=False)
            return
    setattr(owner, name, value)
