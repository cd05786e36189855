"""What the weight recorder (:mod:`.weight_recorder`) needs to know of tensors and ops: a
tensor's memory and geometry, which arguments an op writes, which constants a module's graph
reads, and whether a recipe replays to the constants it was recorded from, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_leaves

from embedl_dynamo.graph.input_free import FOLDED_PREFIX
from embedl_dynamo.graph.weight_recipe import WeightRecipe

__all__ = [
    "contiguous_strides",
    "graph_weights",
    "recipe_leaves",
    "overwritten_destination",
    "plain_tensor",
    "replay_problem",
    "same_bits",
    "slots_in",
    "tensor_geometry",
    "used_constants",
    "written_arguments",
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same dtype, shape and bytes (NaN equal to itself)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.numel():
        return True
    # a 0-d tensor has no last dim to reinterpret as bytes: compare its 1-element reshape
    return torch.equal(_bytes(a), _bytes(b))


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def graph_weights(graph: nn.Module) -> dict[str, torch.Tensor]:
    """A frozen graph's constants by name (its buffers and parameters): a recipe's leaves."""
    weights = dict(graph.named_buffers(remove_duplicate=False))
    weights.update(graph.named_parameters(remove_duplicate=False))
    return weights


def recipe_leaves(graph: nn.Module) -> dict[str, torch.Tensor]:
    """The weights a recipe reads: a frozen graph's constants but those freezing computed from
    no input (``embedl_folded_*``), which no ``state_dict`` changes and a freeze of the same
    graph computes again, equal: what derives from them alone is an independent constant.

    Example:
        >>> class Scaled(nn.Module):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.w = nn.Parameter(torch.ones(2))
        ...         self.register_buffer(FOLDED_PREFIX + "0", torch.arange(2.0))
        >>> sorted(recipe_leaves(Scaled()))
        ['w']
    """
    return {k: v for k, v in graph_weights(graph).items() if not k.startswith(FOLDED_PREFIX)}


def tensor_geometry(t: torch.Tensor) -> tuple[Any, ...]:
    """Where a tensor sits in its storage: offset, shape, strides, dtype."""
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def plain_tensor(t: torch.Tensor) -> bool:
    """A dense CPU/CUDA tensor with storage (not fake, meta or another subclass)."""
    return (type(t) is torch.Tensor or isinstance(t, nn.Parameter)) and t.device.type != "meta"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a row-major tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def overwritten_destination(
    func: Any, args: tuple[Any, ...], states: list[Any]
) -> torch.Tensor | None:
    """The destination of a ``copy_`` from a weight that writes all of it (a deepcopy's fresh
    memory: what it held before does not matter), else None."""
    if func is not torch.ops.aten.copy_.default or len(args) < 2:
        return None
    dst, src = args[0], args[1]
    if states[0] != (None, None) or states[1][0] is None or dst.shape != src.shape:
        return None
    return dst


def written_arguments(
    func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (in-place and ``out=`` arguments)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = kwargs.get(arg.name, args[i] if i < len(args) else None)
        written.extend(v for v in tree_leaves(value) if isinstance(v, torch.Tensor))
    return written


def slots_in(data: Any) -> Iterator[int]:
    """The slots a recorded op's encoded arguments read (a tensor's, or a storage's)."""
    if isinstance(data, dict):
        for key in ("slot", "storage_of"):
            if key in data and len(data) == 1:
                yield data[key]
                return
        for value in data.values():
            yield from slots_in(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from slots_in(value)


def used_constants(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's parameters and buffers; of a GraphModule, those its graph reads (a
    ``get_attr`` target, or inside a called submodule): a rewrite may leave others behind."""
    named = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    if not isinstance(module, fx.GraphModule):
        yield from named
        return
    used = {str(n.target) for n in module.graph.nodes if n.op in ("get_attr", "call_module")}
    for name, tensor in named:
        parts = name.split(".")
        if any(".".join(parts[:k]) in used for k in range(1, len(parts) + 1)):
            yield name, tensor


def replay_problem(
    recipe: WeightRecipe,
    live: dict[str, dict[str, torch.Tensor]],
    leaves: dict[str, torch.Tensor],
) -> str | None:
    """Why replaying ``recipe`` on the recorded weights does not give the constants the
    pipeline computed, bit for bit; None when it does."""
    try:
        replayed = recipe.replay(leaves)
    except Exception as exc:
        return f"replay failed: {type(exc).__name__}: {exc}"
    for model, constants in live.items():
        for name, tensor in constants.items():
            if not same_bits(replayed[model][name], tensor.detach()):
                return f"replay gives another {name} than the pipeline"
    return None
