"""New weights into an exported file without exporting again: :func:`refit`.

An exported file's sidecar keeps its weight recipe (:mod:`.file_recipe`): the tensor ops that
turn the model's weights into the file's initializers (folded BatchNorm, INT8 weight scales,
the int8 codes), checked bit for bit against the file when it was written. :func:`refit`
replays it on the new weights, writes them into the file's initializers (the graph, the
activation scales, the opset and every other field stay), checks the result and replaces the
file, its data file and its sidecar, which records the refit:

* a float file computes what an export of the model with these weights computes, bit for bit
  (the same initializers in the same graph);
* an INT8 file keeps the activation scales calibrated at export. With ``calibration_data`` it
  must stay within the ``accuracy_budget`` it was exported with, against its own graph in
  float with the new weights (Q/DQ taken out, the float weights in); a miss raises and leaves
  the file as it was. Without, the scales are kept unchecked: the sidecar says so, and a
  warning.

The files are written beside the old ones and moved over them only once verified; the
refitted file passes ``load()``'s integrity check (:func:`~.integrity.verify_artifact`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import atomic_write_text
from embedl_dynamo.cache.keys import jsonable
from embedl_dynamo.deploy.file_recipe import RECIPE_FIELD, REFIT_FIELD, file_values
from embedl_dynamo.deploy.integrity import verify_artifact
from embedl_dynamo.deploy.refit_check import check_int8, runs
from embedl_dynamo.deploy.sidecar import data_file_record, read_sidecar, sidecar_path
from embedl_dynamo.errors import ExportArgumentError, ExportError
from embedl_dynamo.graph.non_persistent import recipe_for, unexpected_keys
from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.onnx.external_data import data_path, save_model_file
from embedl_dynamo.onnx.refit_weights import replace_initializers

__all__ = ["refit"]

logger = logging.getLogger(__name__)


def refit(
    path: str | os.PathLike[str],
    state_dict: Mapping[str, torch.Tensor] | nn.Module,
    calibration_data: Iterable[Any] | None = None,
) -> Path:
    """Write new weights into the exported file at ``path`` and its sidecar (see the module).

    Args:
        path: the ``.onnx`` file [export][embedl_dynamo.export] wrote (its sidecar beside it).
        state_dict: the new weights, named as ``model.state_dict()`` names them; or the model
            itself (its parameters and buffers, non-persistent buffers included). A
            ``state_dict`` lacks the non-persistent buffers by design (a rotary embedding's
            ``inv_freq``): as ``load_state_dict`` does, what the file computed from them alone
            is kept, checked against the digests its export recorded.
        calibration_data: batches of the model's inputs (tensors or tuples) to check an INT8
            file on; None keeps its scales unchecked (said in the sidecar and a warning).

    Returns:
        ``path``.

    Raises:
        ExportArgumentError: a weight is missing, of another shape or dtype than at export,
            or a key the exported model did not have (a new architecture needs a new export);
            or the file computed a constant from a non-persistent buffer the ``state_dict``
            lacks together with a weight (pass the model).
        ExportError: the file cannot be refitted (exported without a recipe, a TensorRT engine
            beside it, a constant its recipe cannot compute); the message says why.
        VerificationError: the refitted INT8 file misses ``accuracy_budget`` with the kept
            scales; the file is left as it was.
        ValueError: the file is not the one its sidecar describes (``load()``'s check).

    Example:
        ```python
        embedl_dynamo.refit("model.onnx", model.state_dict())  # new weights, same graph
        ```
    """
    path = Path(path)
    verify_artifact(path)  # the file is the one its sidecar describes
    sidecar, _ = read_sidecar(path)
    recipe, model_name = _recipe(path, sidecar)
    recipe, weights = _weights(path, state_dict, recipe)
    replayed = recipe.replay(weights)
    import onnx

    model = onnx.load(str(path))
    try:
        values = file_values(model, recipe, replayed, model_name)
    except ValueError as exc:
        raise ExportError(f"{path.name} cannot be refitted: {exc}; export it again") from exc
    replace_initializers(model, values)
    quantized = bool(sidecar.get("quantized"))
    with tempfile.TemporaryDirectory(prefix=".refit-", dir=path.parent) as tmp:
        staged = Path(tmp) / path.name
        save_model_file(model, staged)
        del model
        record = _verify(staged, sidecar, replayed[model_name], quantized, calibration_data)
        _replace(staged, path)
    sidecar.update(data_file_record(path), onnx_sha256=sha256_file(path))
    sidecar[REFIT_FIELD] = {
        **(sidecar.get(REFIT_FIELD) or {}),
        **record,
        "weights": len(weights),
        "initializers": len(values),
    }
    atomic_write_text(sidecar_path(path), json.dumps(jsonable(sidecar, default=repr), indent=2))
    verify_artifact(path)
    logger.info(
        "refitted %s: %d initializers from %d weights", path.name, len(values), len(weights)
    )
    return path


def _recipe(path: Path, sidecar: Mapping[str, Any]) -> tuple[WeightRecipe, str]:
    """The file's weight recipe and the transformed model its initializers come from."""
    if sidecar.get("engine_file"):
        raise ExportError(
            f"{path.name} has the TensorRT engine {sidecar['engine_file']} beside it, built with "
            "the old weights; export the model again (refit writes ONNX files only)"
        )
    refit_record = sidecar.get(REFIT_FIELD) or {}
    data = sidecar.get(RECIPE_FIELD)
    if data is None or not refit_record.get("model"):
        why = refit_record.get("reason") or "it was exported without a weight recipe"
        raise ExportError(f"{path.name} cannot be refitted: {why}; export the model again")
    try:
        return WeightRecipe.from_dict(data), str(refit_record["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(
            f"{path.name}: its sidecar's weight recipe is unreadable ({exc}); "
            "export the model again"
        ) from exc


def _weights(
    path: Path, state_dict: Mapping[str, torch.Tensor] | nn.Module, recipe: WeightRecipe
) -> tuple[WeightRecipe, dict[str, torch.Tensor]]:
    """The recipe to replay and its weights from ``state_dict`` (or a module's parameters and
    buffers). A ``state_dict`` lacks the model's non-persistent buffers by design, as
    ``load_state_dict`` takes it: what the file computed from them alone is kept
    (:func:`~embedl_dynamo.graph.non_persistent.recipe_for`). A weight missing otherwise, one
    of another shape or dtype, or a key the exported model did not have is refused by name."""
    if isinstance(state_dict, nn.Module):
        keys = list(state_dict.state_dict(keep_vars=True))
        named = dict(state_dict.named_buffers(remove_duplicate=False))
        named.update(state_dict.named_parameters(remove_duplicate=False))
    elif isinstance(state_dict, Mapping):
        keys, named = list(state_dict), dict(state_dict)
    else:
        raise ExportArgumentError(
            f"state_dict is a {type(state_dict).__name__}; pass model.state_dict() or the model"
        )
    weights = {name: named[name] for name in recipe.leaves if name in named}
    try:
        recipe = recipe_for(recipe, weights)
    except ValueError as exc:
        raise ExportArgumentError(f"{path.name}: {exc}; pass the model itself") from exc
    missing = recipe.missing(weights)
    if missing:
        raise ExportArgumentError(
            f"weight {missing[0]} is missing ({len(missing)} in all); pass all of "
            "model.state_dict(), or the model itself"
        )
    why = recipe.leaf_problem(weights)
    unexpected = unexpected_keys(recipe, keys)
    if why is None and unexpected:
        why = f"{unexpected[0]} ({len(unexpected)} in all) is no weight of the exported model"
    if why is not None:
        raise ExportArgumentError(
            f"{why}; refit takes the weights of the architecture that was exported "
            "(export the model again for another one)"
        )
    return recipe, {name: t.detach().cpu() for name, t in weights.items()}


def _verify(
    staged: Path,
    sidecar: Mapping[str, Any],
    constants: Mapping[str, torch.Tensor],
    quantized: bool,
    calibration_data: Iterable[Any] | None,
) -> dict[str, Any]:
    """Check the refitted file before it replaces the old one: it loads and runs on its
    runtime; an INT8 one stays within the budget on ``calibration_data``, where given. The
    sidecar's record of what was checked."""
    runtime = (sidecar.get("runtime") or {}).get("runtime") or "onnxruntime"
    if not quantized:
        runs(staged, runtime, calibration_data)
        return {"scales": None, "checked_on": "calibration_data" if calibration_data else None}
    if calibration_data is None:
        warnings.warn(
            f"{staged.name}: refitted without calibration_data; its INT8 activation scales "
            "are kept from the export, unchecked against the new weights (the sidecar says "
            "so). Pass calibration_data to refit() to hold it to accuracy_budget",
            RuntimeWarning,
            stacklevel=3,
        )
        runs(staged, runtime, None)
        return {"scales": "kept from export, not checked (no calibration_data)", "cosine": None}
    budget = float((sidecar.get("settings") or {}).get("accuracy_budget") or 0.99)
    cosine = check_int8(staged, runtime, constants, calibration_data, budget)
    return {
        "scales": f"kept from export: cosine {cosine:.6f} >= accuracy_budget {budget:g}",
        "cosine": cosine,
    }


def _replace(staged: Path, path: Path) -> None:
    """Move the staged file (and its data file) over ``path``'s: the data file first, so the
    model file never names weights that are not there yet."""
    staged_data, data = data_path(staged), data_path(path)
    if staged_data.exists():
        os.replace(staged_data, data)
    elif data.exists():
        data.unlink()
    os.replace(staged, path)
