"""The weight recipe of an exported file, for :func:`~embedl_dynamo.deploy.refit.refit`.

While :func:`~embedl_dynamo.deploy.export.export` runs the pipeline, :func:`recording` writes
down how it derives the transformed graph's constants from the model's weights
(:mod:`embedl_dynamo.graph.weight_recorder`). Once the file is written, :func:`recipe_entries`
checks the recipe against it: replayed on the very weights of the export, it must compute
every initializer the file holds, bit for bit
(:func:`~embedl_dynamo.onnx.refit_weights.refit_initializers`). Only then does the sidecar keep
it (``weight_recipe``, data only); ``refit`` says whether the file can be refitted, from which
transformed model (``model``: the one that runs, or ``float_model`` where a lower precision was
rejected) or why not.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from embedl_dynamo.graph.non_persistent import record_state_dict
from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.graph.weight_recorder import WeightRecorder, record_weights
from embedl_dynamo.graph.weight_tensors import graph_weights, recipe_leaves
from embedl_dynamo.onnx.refit_weights import refit_initializers
from embedl_dynamo.pipeline import PipelineResult

__all__ = ["RECIPE_FIELD", "REFIT_FIELD", "file_values", "recipe_entries", "recording"]

logger = logging.getLogger(__name__)

#: the sidecar fields: the recipe, and whether (and from which model) the file can be refitted
RECIPE_FIELD, REFIT_FIELD = "weight_recipe", "refit"
_MODELS = ("model", "float_model")


@contextlib.contextmanager
def recording(graph: fx.GraphModule) -> Iterator[WeightRecorder]:
    """Record the ops that derive constants from ``graph``'s weights while the block runs.

    The tensors freezing computed from no input (``embedl_folded_*``) are no weights: no
    ``state_dict`` changes them, so what derives from them alone is an independent constant."""
    with record_weights(recipe_leaves(graph)) as recorder:
        yield recorder


def file_values(
    model: Any, recipe: WeightRecipe, replayed: Mapping[str, Mapping[str, torch.Tensor]], name: str
) -> dict[str, np.ndarray]:
    """The new initializers of the file's ``model`` from the replayed constants of the
    transformed model ``name`` (ValueError: they cannot be proved to be what an export
    writes)."""
    return refit_initializers(
        model, replayed[name], recipe.independent.get(name, {}), recipe.tainted(name)
    )


def recipe_entries(
    path: Path,
    recorder: WeightRecorder,
    result: PipelineResult,
    graph: fx.GraphModule,
    model: nn.Module,
) -> dict[str, Any]:
    """The sidecar's ``weight_recipe`` and ``refit`` for the file written at ``path`` from
    ``result`` (the pipeline on ``graph``, captured from ``model``, recorded by ``recorder``);
    the recipe's weights are named as ``model`` names them (its ``state_dict`` keys), and it
    records those keys and what it computes from the non-persistent buffers alone."""
    models = {"model": result.model, "float_model": result.float_model or result.model}
    recipe = recorder.finish(models)
    name, why = None, recipe.problem
    if why is None:
        name, why = _fitting_model(path, recipe, graph_weights(graph))
    if why is None:
        why = _name_by_model(recipe, graph_weights(graph), model)
    if why is None:  # what a refit from a state_dict, which lacks its non-persistent buffers, keeps
        record_state_dict(recipe, model)
    if why is not None:
        logger.info("%s: refit() will not take new weights: %s", path.name, why)
        return {RECIPE_FIELD: None, REFIT_FIELD: {"model": None, "reason": why}}
    return {RECIPE_FIELD: recipe.to_dict(), REFIT_FIELD: {"model": name, "reason": None}}


def _fitting_model(
    path: Path, recipe: WeightRecipe, weights: Mapping[str, torch.Tensor]
) -> tuple[str | None, str | None]:
    """The transformed model whose replayed constants give every initializer of the file at
    ``path`` bit for bit, or why none does."""
    import onnx

    model = onnx.load(str(path))
    old = {i.name: i for i in model.graph.initializer}
    replayed = recipe.replay(weights)
    reasons = []
    for name in _MODELS:
        try:
            values = file_values(model, recipe, replayed, name)
        except ValueError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        differs = [k for k, v in values.items() if k in old and not _equal(old[k], v)]
        if not differs:
            return name, None
        reasons.append(f"{name}: the recipe does not give initializer {differs[0]}")
    return None, "; ".join(reasons)


def _name_by_model(
    recipe: WeightRecipe, weights: Mapping[str, torch.Tensor], model: nn.Module
) -> str | None:
    """Rename the recipe's weights (the captured graph's constants) after the tensors of
    ``model`` they are, in place; or why one of them is none of its parameters or buffers."""
    names = {}
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(_where(tensor), name)
    leaves = {}
    for leaf, spec in recipe.leaves.items():
        tensor = weights.get(leaf)
        found = names.get(_where(tensor)) if tensor is not None else None
        if found is None:
            return f"the graph reads {leaf}, which is no parameter or buffer of the model"
        leaves[found] = spec
    recipe.leaves = leaves
    return None


def _where(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def _equal(proto: Any, value: np.ndarray) -> bool:
    from onnx import numpy_helper

    old = numpy_helper.to_array(proto)
    return (
        old.dtype == value.dtype and old.shape == value.shape and old.tobytes() == value.tobytes()
    )
