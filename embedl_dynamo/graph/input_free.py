"""Folding the tensors a graph computes from no input: computed once, at freezing, in PyTorch.

A graph often builds tensors that read neither an input nor a weight: a causal mask from
``arange`` of a static length, T5's and DeBERTa's relative-position buckets, Swin's window
masks. Each call would compute them again, and the integer ops they use (int64 products,
``sign``, casts of logarithms to int64) are the ones a runtime computes differently from
PyTorch, which would keep them, and so a piece of the graph, in PyTorch. Like the constant
folding of inductor's freezing (``torch._inductor.freezing``), this pass evaluates them once, in
PyTorch, so they are exactly PyTorch's values, and stores each as a constant of the graph.

What is folded, and what is not:

* a node is *input-free* when every node it reads is input-free; placeholders and ``get_attr``
  (weights and buffers, which may change and are refitted) are not. A *fill* (``new_ones``,
  ``zeros_like``, ``full_like``... of a static shape) reads only its tensor argument's shape and
  dtype, so it is input-free whatever that tensor is: Longformer's masks of its diagonals,
  ``x.new_ones(n, n).tril().flip(0)``, fold, and the casts they take (a float mask's ``bool``,
  which OpenVINO computes differently on NaN) with them. A fill read by the rest of the graph
  is not stored: it costs a runtime no more to make than to read. Random ops, ops without a
  defined result (``empty``), ops with an effect (an in-place write, an assertion) and calls of
  modules are never folded, nor is anything they read or that reads them;
* only the tensors where input-free values meet the rest of the graph are stored, each at most
  :data:`MAX_FOLDED_BYTES`; a larger or an empty one stays computed;
* a tensor the graph returns, or that shares storage with one it returns, stays computed: each
  call must return a tensor of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.aliasing import keeps_side_effects
from embedl_dynamo.graph.analysis import analyze
from embedl_dynamo.graph.nodes import node_value_meta

__all__ = ["FOLDED_PREFIX", "MAX_FOLDED_BYTES", "fold_input_free", "input_free_value"]

#: the attribute name prefix of a folded tensor (``embedl_folded_0``...)
FOLDED_PREFIX = "embedl_folded_"
#: the largest tensor stored as a folded constant, in bytes
MAX_FOLDED_BYTES = 16 * 2**20

#: ops whose arguments after the tensor are sizes, which take a folded integer as a Python int
_SIZE_READERS = frozenset(
    {
        "view",
        "reshape",
        "expand",
        "as_strided",
        "repeat",
        "narrow",
        "new_zeros",
        "new_ones",
        "new_empty",
    }
)
#: ops whose value is not a function of their arguments: never folded
_NOT_FOLDED = frozenset(
    """
    rand rand_like randn randn_like randint randint_like randperm normal bernoulli multinomial
    poisson dropout alpha_dropout feature_dropout feature_alpha_dropout dropout1d dropout2d
    dropout3d uniform_ normal_ exponential_ geometric_ cauchy_ log_normal_ random_ bernoulli_
    empty empty_like new_empty empty_strided
    """.split()
)
#: fills, by op: the position of their fill value in ``args`` and its keyword, or the value
_FILLS: dict[str, tuple[int, str] | int] = {
    "new_zeros": 0,
    "new_ones": 1,
    "zeros_like": 0,
    "ones_like": 1,
    "new_full": (2, "fill_value"),
    "full_like": (1, "fill_value"),
}


def fold_input_free(gm: fx.GraphModule) -> int:
    """Evaluate ``gm``'s input-free tensors once and store each as a constant (in place).

    Returns:
        How many tensors were stored.

    Example:
        >>> graph = fx.Graph()
        >>> x = graph.placeholder("x")
        >>> mask = graph.call_function(torch.lt, (graph.call_function(torch.arange, (4,)), 3))
        >>> _ = graph.output(graph.call_function(torch.mul, (x, mask)))
        >>> gm = fx.GraphModule(torch.nn.Module(), graph)
        >>> fold_input_free(gm)
        1
        >>> [n.op for n in gm.graph.nodes]
        ['placeholder', 'get_attr', 'call_function', 'output']
    """
    free = _input_free(gm)
    found = _meeting_the_graph(gm, free)
    if not found:
        return 0  # most graphs: nothing to store, and no need of their aliasing
    classes, returned = _returned_classes(gm)
    stored, changed = 0, False
    for node, value, outside in found:
        if classes.get(node, node) in returned:
            continue
        outside = _as_sizes(node, value, outside)
        changed |= not outside
        if outside:
            _store(gm, node, value, outside, f"{FOLDED_PREFIX}{stored}")
            stored += 1
    if stored or changed:
        _erase_unused(gm, free)
        gm.recompile()
    return stored


def _meeting_the_graph(
    gm: fx.GraphModule, free: set[fx.Node]
) -> list[tuple[fx.Node, torch.Tensor, list[fx.Node]]]:
    """The input-free tensors the rest of the graph reads, evaluated, with those readers
    (``free``'s other nodes are evaluated on the way); a fill read there stays made, but the
    sizes it reads are given to it as numbers."""
    made = {n for n in free if _fill_value(n) is not None and any(u not in free for u in n.users)}
    env: dict[fx.Node, Any] = {}
    found = []
    for node in gm.graph.nodes:
        if node not in free:
            continue
        env[node] = value = _evaluate(node, env)
        outside = [user for user in node.users if user not in free or user in made]
        if outside and node not in made and _storable(value):
            found.append((node, value, outside))
    return found


def _as_sizes(node: fx.Node, value: Any, readers: list[fx.Node]) -> list[fx.Node]:
    """Give ``value``, a one-element integer tensor, as a Python int to the readers that take
    it as a size (Longformer's chunk count in ``view`` and ``as_strided``: exporters and shape
    passes take ints there, not tensors); the readers left to read it as a tensor."""
    if value.numel() != 1 or value.is_floating_point() or value.dtype == torch.bool:
        return readers
    number = int(value)

    def as_int(argument: fx.Node) -> Any:
        return number if argument is node else argument

    left = []
    for reader in readers:
        name = str(reader.target) if reader.op == "call_method" else ""
        name = name or getattr(reader.target, "__name__", "")
        if name not in _SIZE_READERS or reader.args[:1] == (node,):
            left.append(reader)
            continue
        reader.args = (reader.args[0], *fx.node.map_arg(reader.args[1:], as_int))
        reader.kwargs = fx.node.map_arg(reader.kwargs, as_int)
    return left


def input_free_value(node: fx.Node) -> Any:
    """What ``node`` computes from constants alone, evaluated now, or None where it reads a
    graph input or a weight (Longformer's ``torch.div(32, 4, rounding_mode="trunc") - 1``,
    a size Dynamo records as a tensor op).

    Example:
        >>> import operator
        >>> graph = fx.Graph()
        >>> four = graph.call_function(torch.div, (32, 8), {"rounding_mode": "trunc"})
        >>> input_free_value(graph.call_function(operator.add, (four, 1)))
        tensor(5)
    """
    env: dict[fx.Node, Any] = {}
    pending = [node]
    while pending:
        current = pending[-1]
        if current.op not in ("call_function", "call_method") or not _foldable(current):
            return None
        missing = [source for source in current.all_input_nodes if source not in env]
        if missing:
            pending.extend(missing)
            continue
        env[current] = _evaluate(current, env)
        pending.pop()
    return env[node]


def _input_free(gm: fx.GraphModule) -> set[fx.Node]:
    """The calls that read only input-free nodes and constants, and may be folded (a fill's
    tensor argument, of which it reads only the shape and dtype, is not read)."""
    free: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or not _foldable(node):
            continue
        sources = node.all_input_nodes
        if _fill_value(node) is not None:
            sources = [s for s in sources if s is not node.args[0]]
        if all(source in free for source in sources):
            free.add(node)
    return free


def _fill_value(node: fx.Node) -> bool | int | float | None:
    """The number a fill of a static shape writes everywhere (None: ``node`` is not one)."""
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    where = _FILLS.get(name)
    value = node_value_meta(node)
    if where is None or not isinstance(value, torch.Tensor) or not node.args:
        return None
    if not all(isinstance(n, int) for n in (*value.shape, *value.stride())):
        return None  # a dynamic shape: the fill is made on each call
    if isinstance(where, tuple):
        position, keyword = where
        args = node.args
        where = args[position] if len(args) > position else node.kwargs.get(keyword)
    return where if isinstance(where, (bool, int, float)) else None


def _made_fill(node: fx.Node) -> torch.Tensor:
    """What the fill ``node`` computes, made from its recorded shape, strides and dtype."""
    value = node_value_meta(node)
    shape, stride = tuple(value.shape), value.stride()
    made = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
    return made.fill_(_fill_value(node))


def _foldable(node: fx.Node) -> bool:
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name in _NOT_FOLDED or keeps_side_effects(node):
        return False
    return not any(keeps_side_effects(user) for user in node.users)


def _returned_classes(gm: fx.GraphModule) -> tuple[Mapping[fx.Node, Any], set[Any]]:
    """Each node's alias key, and the keys of the tensors ``gm`` returns."""
    analysis = analyze(gm)
    returned: list[fx.Node] = []
    fx.node.map_arg(analysis.outputs, returned.append)
    classes = analysis.classes
    return classes, {classes.get(node, node) for node in returned}


def _evaluate(node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    if _fill_value(node) is not None and node.args[0] not in env:
        return _made_fill(node)
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _storable(value: Any) -> bool:
    """A tensor with elements, up to :data:`MAX_FOLDED_BYTES`; an empty one (a cache's
    ``torch.tensor([])``, which ``cat`` takes beside any rank) stays the op that makes it."""
    if not isinstance(value, torch.Tensor) or not value.numel():
        return False
    return value.numel() * value.element_size() <= MAX_FOLDED_BYTES


def _store(
    gm: fx.GraphModule, node: fx.Node, value: torch.Tensor, readers: list[fx.Node], name: str
) -> None:
    """Register ``value`` as the buffer ``name`` and let ``readers`` read it for ``node``."""
    while hasattr(gm, name):
        name += "_"
    gm.register_buffer(name, value.detach().clone())
    with gm.graph.inserting_before(node):
        constant = gm.graph.get_attr(name)
    constant.meta.update(node.meta)
    if "example_value" not in constant.meta and node_value_meta(node) is None:
        constant.meta["val"] = value
    for reader in readers:
        reader.replace_input_with(node, constant)


def _erase_unused(gm: fx.GraphModule, free: Iterable[fx.Node]) -> None:
    for node in reversed(list(gm.graph.nodes)):
        if node in free and not node.users:
            gm.graph.erase_node(node)
