"""Which tensor a node writes in place, and which nodes may share storage.

The facts :mod:`embedl_dynamo.graph.functionalize` decides from: :func:`mutated_tensor` (the
tensor an in-place op, an ``inplace=True`` flag or an ``out=`` argument writes),
:func:`alias_classes` (nodes that may share storage get one key) and :func:`identity_root` (the
tensor a node *is*, through in-place ops and ops that return their input itself).

Aliasing comes from the storages of the example values Dynamo records on each node
(``meta["example_value"]``), or of a run on example inputs (:func:`record_storages`); without
either, from the ops themselves, assuming that every view-like op aliases its input.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "INPLACE_OPERATORS",
    "STORAGE_KEY",
    "VIEW_METHODS",
    "alias_classes",
    "identity_root",
    "inplace_flag",
    "is_torch_op",
    "keeps_side_effects",
    "mutated_tensor",
    "out_argument",
    "record_storages",
    "same_tensor_source",
]

STORAGE_KEY = "embedl_storage"  # node.meta: a hashable storage identity from a recorded run

INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
    operator.imatmul: operator.matmul,
}
# ops whose result may share storage with their first input (used when no storages are known)
VIEW_METHODS = {
    "view",
    "view_as",
    "reshape",
    "reshape_as",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "t",
    "transpose",
    "permute",
    "expand",
    "expand_as",
    "narrow",
    "select",
    "unbind",
    "split",
    "chunk",
    "tensor_split",
    "diagonal",
    "unfold",
    "as_strided",
    "detach",
    "to",
    "type",
    "type_as",
    "contiguous",
    "real",
    "imag",
    "view_as_real",
    "view_as_complex",
    "movedim",
    "swapaxes",
    "swapdims",
    "mT",
    "T",
    "H",
    "mH",
    "__getitem__",
    "float",
    "half",
    "double",
    "bfloat16",
    "int",
    "long",
    "cpu",
    "cuda",
    "data",
    "requires_grad_",
    "align_as",
}
# ops of several outputs, each a new tensor (a pick of one aliases nothing; a pick of
# ``split``'s, ``unbind``'s or ``broadcast_tensors``' shares its input's storage): always a
# tuple, or a tuple where the recorded value says so (``max`` with a dim; without one a
# tensor, which indexing views)
_FRESH_TUPLE_OPS = frozenset(
    (
        *("topk", "sort", "var_mean", "std_mean", "aminmax"),
        *("cummax", "cummin", "frexp", "mode", "kthvalue"),
    )
)
_FRESH_TUPLE_WITH_DIM = frozenset(("max", "min", "median", "nanmedian"))
# modules whose output is a new tensor (nn.Identity, in linear.py, returns its input)
_FRESH_MODULES = (
    nn.modules.conv._ConvNd,
    nn.Linear,
    nn.Bilinear,
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.Mish,
    nn.Softmax,
    nn.LogSoftmax,
    nn.MultiheadAttention,
    nn.Upsample,
    nn.PixelShuffle,
    nn.modules.padding._ConstantPadNd,
)


def mutated_tensor(node: fx.Node) -> Any:
    """The tensor (node) that ``node`` writes into in place, or None if it writes nothing."""
    if node.op not in ("call_function", "call_method", "call_module") or not node.args:
        return out_argument(node)
    first = node.args[0]
    if node.op == "call_method":
        name = str(node.target)
        return first if _is_inplace_name(name) else None
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        return first if getattr(module, "inplace", False) is True else None
    target = node.target
    if target in INPLACE_OPERATORS or target is operator.setitem:
        return first
    if _is_inplace_name(getattr(target, "__name__", "")) and is_torch_op(target):
        return first
    if inplace_flag(node):
        return first
    return out_argument(node)


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name != "requires_grad_"


def is_torch_op(target: Any) -> bool:
    module = getattr(target, "__module__", None) or ""
    return module.startswith("torch") or isinstance(target, torch._ops.OpOverloadPacket)


def out_argument(node: fx.Node) -> Any:
    out = node.kwargs.get("out") if node.op == "call_function" else None
    return out if isinstance(out, fx.Node) else None


def inplace_flag(node: fx.Node) -> bool:
    """``F.relu(x, inplace=True)``, also given positionally (``F.hardswish(x, True)``)."""
    if node.kwargs.get("inplace") is True:
        return True
    signature = _signature(node.target)
    if signature is None or "inplace" not in signature.parameters:
        return False
    try:
        bound = signature.bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    return bound.arguments.get("inplace") is True


def _signature(target: Any) -> inspect.Signature | None:
    """``target``'s signature, looked up once per target (every node of every graph asks)."""
    try:
        return _cached_signature(target)
    except TypeError:  # an unhashable target
        return _signature_of(target)


def _signature_of(target: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


_cached_signature = functools.lru_cache(maxsize=1024)(_signature_of)


def record_storages(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Run ``gm`` on ``args`` and note each tensor node's storage in ``meta[STORAGE_KEY]``.

    Values stay alive for the whole run, so two nodes get the same key only if they share
    storage."""
    keep: list[Any] = []

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            keep.append(result)
            if isinstance(result, torch.Tensor):
                n.meta[STORAGE_KEY] = _storage(result)
            return result

    with torch.no_grad():
        _Recorder(gm, garbage_collect_values=False).run(*args)


def _storage(tensor: torch.Tensor) -> Any:
    try:
        return StorageWeakRef(tensor.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without storage (sparse, nested)
        return ("no storage", id(tensor))


def _storages(gm: fx.GraphModule) -> dict[fx.Node, Any] | None:
    """Each tensor node's storage identity, from recorded values; None if any is unknown."""
    keys: dict[fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        if STORAGE_KEY in node.meta:
            keys[node] = node.meta[STORAGE_KEY]
            continue
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            keys[node] = _storage(value)
        elif value is None and node.op != "get_attr" and node.target is not operator.setitem:
            return None  # not recorded: fall back to the ops themselves
    return keys


def alias_classes(gm: fx.GraphModule) -> dict[fx.Node, Any]:
    """A key per node; nodes that may share storage get the same key."""
    storages = _storages(gm)
    if storages is not None:
        return storages
    parent = {node: node for node in gm.graph.nodes}

    def find(node: fx.Node) -> fx.Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        sources = _alias_sources(node)
        for source in sources:
            if isinstance(source, fx.Node) and source in parent:
                parent[find(node)] = find(source)
    return {node: find(node) for node in parent}


def _alias_sources(node: fx.Node) -> list[Any]:
    """The inputs ``node``'s value may share storage with (structural rule)."""
    if mutated_tensor(node) is not None:
        return [mutated_tensor(node)]
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op == "call_function" and node.target in (operator.getitem, builtins.getattr):
        return [] if _picks_fresh_output(node) else [node.args[0]]
    if name in VIEW_METHODS or name in ("dropout", "alpha_dropout", "feature_dropout"):
        return [node.args[0]] if node.args else []
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        if isinstance(module, _FRESH_MODULES) and not isinstance(module, nn.Identity):
            return []
        return list(node.all_input_nodes)  # unknown module: assume it may return an input
    return []


def _picks_fresh_output(node: fx.Node) -> bool:
    """Whether ``node`` picks one output of an op whose outputs are new tensors (``topk``'s
    values or indices): it shares storage with nothing the graph holds."""
    source = node.args[0] if node.target is operator.getitem and node.args else None
    if not isinstance(source, fx.Node) or source.op not in ("call_function", "call_method"):
        return False
    name = str(source.target) if source.op == "call_method" else ""
    name = name or getattr(source.target, "__name__", "")
    if name in _FRESH_TUPLE_OPS:
        return True
    value = source.meta.get("example_value", source.meta.get("val"))
    return name in _FRESH_TUPLE_WITH_DIM and isinstance(value, (tuple, list))


def keeps_side_effects(node: fx.Node) -> bool:
    """For ``Graph.eliminate_dead_code``: a node with an effect beyond its value (an in-place
    write, or what FX itself counts as impure) stays even when nothing reads its value."""
    return node.is_impure() or mutated_tensor(node) is not None


def identity_root(node: fx.Node) -> fx.Node:
    """The tensor ``node`` *is*: through in-place ops (``y.add_(1).mul_(2)`` is ``y``) and ops
    that return their input itself (:func:`same_tensor_source`)."""
    while True:
        target = mutated_tensor(node)
        if not isinstance(target, fx.Node) or target is node:
            target = same_tensor_source(node)
        if target is None:
            return node
        node = target


def same_tensor_source(node: fx.Node) -> fx.Node | None:
    """The input ``node`` returns as the very same tensor (``x.to(x.device)``, ``.contiguous()``
    of a contiguous ``x``), as Dynamo's example values show; else None."""
    if node.op not in ("call_method", "call_function") or not node.args:
        return None
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in VIEW_METHODS:  # a functionalized op keeps its in-place example value
        return None
    source = node.args[0]
    if not isinstance(source, fx.Node) or mutated_tensor(node) is not None:
        return None
    value = node.meta.get("example_value")
    same = isinstance(value, torch.Tensor) and value is source.meta.get("example_value")
    return source if same else None
