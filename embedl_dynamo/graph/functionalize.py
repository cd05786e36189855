"""In-place ops made functional before any rewrite, or the graph refused with the reason.

Every later pass (canonicalisation, patterns, precision, ONNX export) is written for a graph
in which a node's value never changes after it is computed. An in-place op breaks that: a
dead-code pass drops ``y.masked_fill_(m, 0)`` whose result is unused, and a rewrite that reads
``y`` after it reads the old value. So, first of all, each in-place op is either

* made functional: ``y.op_(...)`` becomes ``y2 = y.op(...)`` (the op itself where PyTorch has
  no out-of-place form) and every later reader of ``y`` reads ``y2``. This is exact when ``y``
  has no *live alias*: no other tensor sharing its storage (a view of it, the tensor it is a
  view of, the same tensor returned twice) is read after the op. Or
* refused (:func:`mutation_blocker` names why): the op writes into a graph input, a parameter or
  a buffer (directly or through a view, ``.to()`` that returned the same tensor...), writes
  through an alias that is read later (``a, b = y.chunk(2); a.add_(1); return y``), writes
  into an ``out=`` tensor. The backend then runs that graph in PyTorch with one warning, as it
  does for a graph whose outputs share storage with each other or with an input
  (:func:`output_alias`: eager returns views, a runtime would return copies).

Aliasing comes from the storages of the example values Dynamo records on each node
(``meta["example_value"]``), or of a run on example inputs (:func:`record_storages`); without
either, from the ops themselves, assuming that every view-like op aliases its input.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "functionalize",
    "keeps_side_effects",
    "mutated_tensor",
    "mutation_blocker",
    "output_alias",
    "record_storages",
    "writes_into_input",
]

STORAGE_KEY = "embedl_storage"  # node.meta: a hashable storage identity from a recorded run

_INPLACE_OPERATORS = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod, operator.ipow: operator.pow, operator.iand: operator.and_,
    operator.ior: operator.or_, operator.ixor: operator.xor, operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift, operator.imatmul: operator.matmul,
}  # fmt: skip
# ops whose result may share storage with their first input (used when no storages are known)
_VIEW_METHODS = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
    "t", "transpose", "permute", "expand", "expand_as", "narrow", "select", "unbind", "split",
    "chunk", "tensor_split", "diagonal", "unfold", "as_strided", "detach", "to", "type",
    "type_as", "contiguous", "real", "imag", "view_as_real", "view_as_complex", "movedim",
    "swapaxes", "swapdims", "mT", "T", "H", "mH", "__getitem__", "float", "half", "double",
    "bfloat16", "int", "long", "cpu", "cuda", "data", "requires_grad_", "align_as",
}  # fmt: skip
# modules whose output is a new tensor (nn.Identity, in linear.py, returns its input)
_FRESH_MODULES = (
    nn.modules.conv._ConvNd, nn.Linear, nn.Bilinear, nn.modules.batchnorm._NormBase,
    nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.Embedding, nn.EmbeddingBag,
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid,
    nn.LeakyReLU, nn.ELU, nn.Mish, nn.Softmax, nn.LogSoftmax, nn.MultiheadAttention,
    nn.Upsample, nn.PixelShuffle, nn.modules.padding._ConstantPadNd,
)  # fmt: skip


def mutated_tensor(node: fx.Node) -> Any:
    """The tensor (node) that ``node`` writes into in place, or None if it writes nothing."""
    if node.op not in ("call_function", "call_method", "call_module") or not node.args:
        return _out_argument(node)
    first = node.args[0]
    if node.op == "call_method":
        name = str(node.target)
        return first if _is_inplace_name(name) else None
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        return first if getattr(module, "inplace", False) is True else None
    target = node.target
    if target in _INPLACE_OPERATORS or target is operator.setitem:
        return first
    if _is_inplace_name(getattr(target, "__name__", "")) and _is_torch(target):
        return first
    if _inplace_flag(node):
        return first
    return _out_argument(node)


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name != "requires_grad_"


def _is_torch(target: Any) -> bool:
    module = getattr(target, "__module__", None) or ""
    return module.startswith("torch") or isinstance(target, torch._ops.OpOverloadPacket)


def _out_argument(node: fx.Node) -> Any:
    out = node.kwargs.get("out") if node.op == "call_function" else None
    return out if isinstance(out, fx.Node) else None


def _inplace_flag(node: fx.Node) -> bool:
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


def _alias_classes(gm: fx.GraphModule) -> dict[fx.Node, Any]:
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
        return [node.args[0]]
    if name in _VIEW_METHODS or name in ("dropout", "alpha_dropout", "feature_dropout"):
        return [node.args[0]] if node.args else []
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        if isinstance(module, _FRESH_MODULES) and not isinstance(module, nn.Identity):
            return []
        return list(node.all_input_nodes)  # unknown module: assume it may return an input
    return []


def keeps_side_effects(node: fx.Node) -> bool:
    """For ``Graph.eliminate_dead_code``: a node with an effect beyond its value (an in-place
    write, or what FX itself counts as impure) stays even when nothing reads its value."""
    return node.is_impure() or mutated_tensor(node) is not None


def _identity_root(node: fx.Node) -> fx.Node:
    """The tensor an in-place op's result *is* (``y.add_(1).mul_(2)`` is ``y``)."""
    target = mutated_tensor(node)
    while isinstance(target, fx.Node) and target is not node:
        node, target = target, mutated_tensor(target)
    return node


def writes_into_input(gm: fx.GraphModule) -> bool:
    """Whether an in-place op of ``gm`` may write into a graph input, parameter or buffer
    (running the graph would then change the caller's tensors)."""
    classes = _alias_classes(gm)
    inputs = {classes[n] for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")}
    return any(
        classes.get(target, target) in inputs
        for target in (mutated_tensor(node) for node in gm.graph.nodes)
        if isinstance(target, fx.Node)
    )


def mutation_blocker(
    gm: fx.GraphModule, name_of: Callable[[fx.Node], str] | None = None
) -> str | None:
    """Why ``gm``'s in-place ops cannot be made functional exactly, or None (see the module).

    Args:
        gm: the graph, with Dynamo's example values or :func:`record_storages`' keys if known.
        name_of: names a graph input in the message (default: the node's name).
    """
    classes = _alias_classes(gm)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    sources = [n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr") and n in classes]
    inputs = {classes[n] for n in sources}
    for node in gm.graph.nodes:
        target = mutated_tensor(node)
        if target is None:
            continue
        what = _describe(node)
        if _out_argument(node) is not None:
            return f"{what} writes into an out= tensor"
        if not isinstance(target, fx.Node) or target not in classes:
            return f"{what} writes into a value the graph cannot follow"
        if classes[target] in inputs:
            root = next(n for n in sources if classes[n] == classes[target])
            name = name_of(root) if name_of is not None else str(root.target)
            return f"the graph mutates {name} in place ({what}, directly or through a view)"
        live = _live_alias(node, target, classes, order)
        if live is not None:
            return f"{what} writes into {target.name}, whose alias {live.name} is read later"
    return None


def _live_alias(
    node: fx.Node, target: fx.Node, classes: dict[fx.Node, Any], order: dict[fx.Node, int]
) -> fx.Node | None:
    """A node created before ``node`` that shares ``target``'s storage and is read after it
    (the in-place op on ``target`` would change what it reads)."""
    position = order[node]
    same = _identity_root(target)
    for other, key in classes.items():
        if key != classes[target] or order.get(other, position + 1) > position:
            continue
        if other is node or _identity_root(other) is same:
            continue  # the same tensor: functionalize() redirects its later readers
        if any(order.get(user, -1) > position for user in other.users):
            return other
    return None


def output_alias(gm: fx.GraphModule) -> str | None:
    """Why ``gm``'s outputs cannot be returned as independent tensors, or None.

    In eager, outputs that are views of one another or of an input share storage, so a write
    into one shows in the other; a runtime that returns fresh tensors would lose that.
    """
    classes = _alias_classes(gm)
    inputs = {
        classes[n] for n in gm.graph.nodes if n.op in ("placeholder", "get_attr") and n in classes
    }
    output = next(n for n in gm.graph.nodes if n.op == "output")
    seen: dict[Any, fx.Node] = {}
    for value in _flat_nodes(output.args):
        key = classes.get(value)
        if key is None or not isinstance(value, fx.Node):
            continue
        if value.op in ("placeholder", "get_attr") or key in inputs:
            return f"the graph returns {value.name}, which shares storage with an input"
        if key in seen:
            return f"the graph returns {seen[key].name} and {value.name}, which share storage"
        seen[key] = value
    return None


def _flat_nodes(args: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(args, found.append)
    return found


def _describe(node: fx.Node) -> str:
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    return f"the in-place op {name or node.target} ({node.name})"


def functionalize(gm: fx.GraphModule) -> fx.GraphModule:
    """Make every in-place op of ``gm`` functional, in place; returns ``gm``.

    Raises:
        ValueError: :func:`mutation_blocker` names a reason (check it first).
    """
    reason = mutation_blocker(gm)
    if reason is not None:
        raise ValueError(reason)
    changed = False
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # no node is added or moved below
    for node in list(gm.graph.nodes):
        target = mutated_tensor(node)
        if target is None or node.target is operator.setitem:
            continue  # setitem returns None: the write stays, on a tensor nothing else reads
        for user in list(target.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(target, node)
        _out_of_place(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _out_of_place(node: fx.Node) -> None:
    """Turn ``node`` into its out-of-place form where PyTorch has one; else leave the op."""
    if node.op == "call_method":
        name = str(node.target)[:-1]
        if hasattr(torch.Tensor, name):
            node.target = name
    elif node.op == "call_function":
        if node.target in _INPLACE_OPERATORS:
            node.target = _INPLACE_OPERATORS[node.target]
        elif "inplace" in node.kwargs:
            node.kwargs = {**node.kwargs, "inplace": False}
        elif _inplace_flag(node):
            return  # positional flag: the op stays in place, on a tensor nothing else reads
        else:
            plain = getattr(torch, getattr(node.target, "__name__", "")[:-1], None)
            if plain is not None and _is_torch(node.target):
                node.target = plain
