"""``as_strided`` over a tensor whose storage order is not its logical order, as a gather.

``as_strided`` reads storage positions, not elements. A runtime holds every tensor contiguous,
and a part kept in PyTorch receives a runtime's contiguous copy, so on either the same call
reads other elements than in eager where the input's storage is laid out otherwise
(Longformer's overlapping chunks of a transposed projection). The layout eager gives the input
is recorded with the graph, so each position read is one of the input's own elements at a
logical index fixed at trace time: :func:`gather_strided_reads` writes the call as that gather,
``x.reshape(-1)[index]``, which reads values only. A read of a position outside the input's
own elements (memory the tensor's storage holds beyond it), or of sizes that are not static
over a tensor sharing its storage, cannot be written so: such a graph stays in PyTorch
(:func:`strided_read_blocker`). A call that reads a contiguous input's own
elements from the start of its storage is left as it is (its row in the conformance table).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch import fx

from embedl_dynamo.graph.input_free import FOLDED_PREFIX, input_free_value
from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import node_value_meta

__all__ = [
    "gather_strided_reads",
    "strided_index",
    "strided_read_blocker",
    "strides_own_elements",
]


def _is_as_strided(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target == "as_strided"
    return node.op == "call_function" and node.target is torch.as_strided


def _call(node: fx.Node) -> tuple[torch.Tensor, list[int], list[int], int] | None:
    """The recorded input and the static size, stride and offset of an ``as_strided`` node,
    or None where one is unknown or symbolic."""
    source = node.args[0] if node.args else None
    value = node_value_meta(source) if isinstance(source, fx.Node) else None

    def argument(position: int, keyword: str) -> object:
        return node.args[position] if len(node.args) > position else node.kwargs.get(keyword)

    size, stride = argument(1, "size"), argument(2, "stride")
    offset = argument(3, "storage_offset")
    if not isinstance(value, torch.Tensor) or size is None or stride is None:
        return None
    size, stride = [_number(n) for n in size], [_number(n) for n in stride]
    offset = value.storage_offset() if offset is None else _number(offset)
    numbers = [*size, *stride, *value.shape, *value.stride(), value.storage_offset(), offset]
    if not all(type(n) is int for n in numbers) or len(size) != len(stride):
        return None
    return value, size, stride, offset


def _number(argument: object) -> object:
    """``argument`` as an int where it is one or a node computing one from constants alone
    (Longformer's chunk count), else as it is."""
    if isinstance(argument, fx.Node):
        value = input_free_value(argument)
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            return int(value)
        return value if type(value) is int else argument
    return argument


def strided_index(
    value: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int
) -> torch.Tensor | None:
    """The logical flat index into ``value`` of each element that
    ``value.as_strided(size, stride, offset)`` reads, in eager's layout of ``value``; None
    where one read position holds none of ``value``'s elements.

    Example:
        >>> x = torch.arange(6.0).view(2, 3).t()  # storage order is not logical order
        >>> index = strided_index(x, (2, 2), (1, 3), 0)
        >>> torch.equal(x.reshape(-1)[index], x.as_strided((2, 2), (1, 3), 0))
        True
    """
    reads = [(n - 1) * s for n, s in zip(size, stride)]
    if any(n == 0 for n in size):
        return torch.zeros(tuple(size), dtype=torch.int64)
    span = offset + sum(reads) + 1
    if value.numel():
        extent = zip(value.shape, value.stride())
        span = max(span, value.storage_offset() + sum((n - 1) * s for n, s in extent) + 1)
    storage = torch.arange(span)  # storage position of each logical element of value
    positions = storage.as_strided(value.shape, value.stride(), value.storage_offset())
    owner = torch.full((span,), -1, dtype=torch.int64)
    owner[positions.reshape(-1)] = torch.arange(value.numel())  # an element it shares: either
    index = owner.as_strided(tuple(size), tuple(stride), offset)
    return None if bool((index < 0).any()) else index.clone()


def _storage_in_logical_order(value: torch.Tensor) -> bool:
    """Whether a contiguous copy of ``value`` gives ``as_strided`` the elements eager's
    storage does, where it reads only ``value``'s own: ``value`` is contiguous from its
    storage's start."""
    return value.is_contiguous() and value.storage_offset() == 0


def strides_own_elements(node: fx.Node) -> bool:
    """Whether the ``as_strided`` call ``node`` reads only its input's own elements in their
    logical order, with static numbers: a runtime's contiguous copy of the input gives it
    eager's elements (the conformance table's ``as_strided`` row)."""
    call = _call(node)
    return (
        call is not None and _storage_in_logical_order(call[0]) and strided_index(*call) is not None
    )


def _owns_its_storage(node: fx.Node) -> bool:
    """Whether ``node``'s input is contiguous and its storage holds its elements alone, so
    that a contiguous copy of it is eager's storage to the byte: PyTorch then computes the
    call as in eager on a runtime's output, whatever its sizes."""
    source = node.args[0] if node.args else None
    value = node_value_meta(source) if isinstance(source, fx.Node) else None
    if not isinstance(value, torch.Tensor) or not _storage_in_logical_order(value):
        return False
    nbytes = value.untyped_storage().nbytes()
    return type(nbytes) is int and nbytes == value.numel() * value.element_size()


def strided_read_blocker(gm: fx.GraphModule) -> str | None:
    """Why ``gm`` cannot run outside PyTorch for its ``as_strided`` calls, or None: a call
    whose sizes are not static over an input that does not own its storage, or that reads a
    position outside its input's own elements."""
    for node in gm.graph.nodes:
        if not _is_as_strided(node):
            continue
        call = _call(node)
        if call is None and _owns_its_storage(node):
            continue  # the table has no row for it: it stays in PyTorch, as in eager
        if call is None:
            return (
                f"{node.name} is an as_strided call whose sizes or strides are not static, "
                "over a tensor that shares its storage"
            )
        if strided_index(*call) is None:
            return (
                f"{node.name} is an as_strided call that reads memory outside its input's "
                "elements, which only PyTorch's storage holds"
            )
    return None


def gather_strided_reads(gm: fx.GraphModule) -> int:
    """Write each ``as_strided`` call of ``gm`` whose input's storage order is not its logical
    order as the gather of the elements it reads (see the module), in place; the others get
    their sizes, strides and offset as ints where constants compute them.

    Returns:
        How many calls were written as gathers.

    Raises:
        ValueError: a call cannot be written so (check :func:`strided_read_blocker` first).
    """
    written, changed = 0, False
    for node in list(gm.graph.nodes):
        if not _is_as_strided(node):
            continue
        call = _call(node)
        if call is None and _owns_its_storage(node):
            continue  # not static, but PyTorch computes it as in eager on any copy
        index = strided_index(*call) if call is not None else None
        if index is None:
            raise ValueError(strided_read_blocker(gm) or f"{node.name} cannot be gathered")
        numbers = [n for n in node.all_input_nodes if n is not node.args[0]]
        if _storage_in_logical_order(call[0]):  # the conformance table's as_strided row
            node.args, node.kwargs = (node.args[0], *call[1:]), {}
        else:
            _gather(gm, node, index, f"{FOLDED_PREFIX}strided_index_{written}")
            written += 1
        _erase_unread(gm, numbers)
        changed = True
    if changed:
        gm.recompile()
    return written


def _gather(gm: fx.GraphModule, node: fx.Node, index: torch.Tensor, name: str) -> None:
    """Replace ``node`` by ``input.reshape(-1)[index]``, ``index`` stored as buffer ``name``."""
    while hasattr(gm, name):
        name += "_"
    gm.register_buffer(name, index)
    with gm.graph.inserting_before(node):
        constant = gm.graph.get_attr(name)
        flat = gm.graph.call_method("reshape", (node.args[0], -1))
        gathered = gm.graph.call_function(operator.getitem, (flat, constant))
    constant.meta["val"] = index
    infer_meta(gm, [flat, gathered])
    node.replace_all_uses_with(gathered)
    gm.graph.erase_node(node)


def _erase_unread(gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
    """Erase the nodes that computed a call's numbers and that nothing reads any more, and
    then what only they read."""
    while nodes:
        node = nodes.pop()
        if node.users or node.op not in ("call_function", "call_method"):
            continue
        if input_free_value(node) is None:
            continue  # reads an input: not only a number's arithmetic
        sources = list(node.all_input_nodes)
        gm.graph.erase_node(node)
        nodes.extend(sources)
