"""The weights a ``state_dict`` lacks by design: an exported model's non-persistent buffers (a
rotary embedding's ``inv_freq``), for a refit from a ``state_dict``.

PyTorch keeps a buffer registered with ``persistent=False`` out of ``state_dict()``, and
``load_state_dict`` leaves it as it is. A refit from a ``state_dict`` does the same with the
file: what the export computed from such buffers alone is kept as the file holds it, checked
as any constant no weight decides (an initializer the exporter computed from it is kept only
where the digests the export recorded of its sources are those constants' digests).

At export, :func:`record_state_dict` writes down in a
:class:`~.weight_recipe.WeightRecipe` the keys of the model's ``state_dict`` (a leaf that is
none of them is a non-persistent buffer) and the digest of each constant the recipe computes
from those buffers alone (``kept``). At refit, :func:`recipe_for` turns the recipe into the
one for the weights given: the buffers they lack taken out, with the ops computing from them,
and the constants computed from them alone moved to the constants no weight decides, with
their digests at export. A constant computed from such a buffer together with a weight needs
the buffer's value, which no ``state_dict`` holds: refused (ValueError naming the buffer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

import torch
from torch import nn

from embedl_dynamo.graph.weight_recipe import WeightRecipe, tensor_digest
from embedl_dynamo.graph.weight_tensors import slots_in

__all__ = ["non_persistent_buffers", "recipe_for", "record_state_dict", "unexpected_keys"]


def non_persistent_buffers(recipe: WeightRecipe) -> list[str]:
    """The leaves of ``recipe`` no ``state_dict`` of the exported model holds (its
    non-persistent buffers); none where the export did not record its keys."""
    if recipe.state_dict is None:
        return []
    keys = set(recipe.state_dict)
    return [name for name in recipe.leaves if name not in keys]


def unexpected_keys(recipe: WeightRecipe, keys: Iterable[str]) -> list[str]:
    """The ``keys`` the exported model's ``state_dict`` did not have (a weight of another
    architecture, which a refit would leave out of the file); none where the export did not
    record them."""
    if recipe.state_dict is None:
        return []
    known = set(recipe.state_dict) | set(recipe.leaves)
    return [key for key in keys if key not in known]


def record_state_dict(recipe: WeightRecipe, model: nn.Module) -> None:
    """Record in ``recipe`` (its leaves named as ``model`` names its tensors) the keys of
    ``model``'s ``state_dict`` and the digests of the constants computed from its
    non-persistent buffers alone, in place (see the module)."""
    recipe.state_dict = sorted(model.state_dict(keep_vars=True))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    values = {name: buffers[name].detach() for name in non_persistent_buffers(recipe)}
    slots, ops, _ = _split(recipe, values)
    kept_outputs = {
        model_name: {n: o for n, o in constants.items() if o.get("slot") in slots}
        for model_name, constants in recipe.outputs.items()
    }
    alone = WeightRecipe(
        {name: recipe.leaves[name] for name in values},
        [recipe.ops[i] for i in ops],
        kept_outputs,
        slots=recipe.slots,
    )
    replayed = alone.replay(values)
    recipe.kept = {
        model_name: {n: tensor_digest(t) for n, t in constants.items()}
        for model_name, constants in replayed.items()
        if constants
    }


def recipe_for(recipe: WeightRecipe, weights: Mapping[str, torch.Tensor]) -> WeightRecipe:
    """The recipe to replay on ``weights``: ``recipe`` without the non-persistent buffers
    ``weights`` lack (see the module); ``recipe`` itself where they lack none.

    Raises:
        ValueError: the recipe computes a constant from such a buffer together with a weight,
            or the export recorded no digest of one computed from it alone.
    """
    absent = [name for name in non_persistent_buffers(recipe) if weights.get(name) is None]
    if not absent:
        return recipe
    slots, ops, mixed = _split(recipe, absent)
    if mixed is not None:
        raise ValueError(
            f"{recipe.ops[mixed][0]} computes a constant from the non-persistent buffer(s) "
            f"{', '.join(absent)} together with weights, and no state_dict holds them"
        )
    outputs: dict[str, dict[str, dict]] = {}
    independent = {model: dict(digests) for model, digests in recipe.independent.items()}
    for model, constants in recipe.outputs.items():
        outputs[model] = {}
        for name, output in constants.items():
            if output.get("slot") not in slots:
                outputs[model][name] = output
                continue
            digest = recipe.kept.get(model, {}).get(name)
            if digest is None:
                raise ValueError(f"the export recorded no digest of {name}, kept from {absent[0]}")
            independent.setdefault(model, {})[name] = digest
    dropped = set(ops)
    return dataclasses.replace(
        recipe,
        leaves={name: spec for name, spec in recipe.leaves.items() if name not in absent},
        ops=[op for i, op in enumerate(recipe.ops) if i not in dropped],
        outputs=outputs,
        independent=independent,
    )


def _split(
    recipe: WeightRecipe, buffers: Collection[str]
) -> tuple[set[int], list[int], int | None]:
    """The slots computed from the leaves ``buffers`` alone, the ops that compute them (their
    positions), and the position of the first op that reads one of them together with another
    slot (None): its outputs, and whatever it writes into, depend on both."""
    slots = {recipe.leaves[name]["slot"] for name in buffers}
    ops, mixed = [], None
    for i, (_, args, kwargs, outs) in enumerate(recipe.ops):
        read = set(slots_in((args, kwargs)))
        if not read & slots:
            continue
        if read <= slots:
            ops.append(i)
            slots.update(s for s in outs if s is not None)
        elif mixed is None:
            mixed = i
    return slots, ops, mixed
