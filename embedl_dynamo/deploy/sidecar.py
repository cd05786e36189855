"""The JSON sidecar written next to an exported file (``model.onnx`` -> ``model.json``).

It holds the plan report, the quantization scales, the layers left in float and why, the input
and output specs, the verification result, the settings and the library versions; ``load()``
reads it back and checks the file's sha256 against it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["SIDECAR_FORMAT", "io_specs", "jsonable", "refuse_foreign_sidecar", "sidecar_path"]

SIDECAR_FORMAT = "embedl_dynamo.export/1"


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar of an exported file: ``model.onnx`` -> ``model.json``."""
    return Path(path).with_suffix(".json")


def refuse_foreign_sidecar(side: Path) -> None:
    """Refuse to overwrite a JSON file that is not a sidecar we wrote (``config.json``...)."""
    if not side.exists():
        return
    try:
        ours = json.loads(side.read_text()).get("format") == SIDECAR_FORMAT
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise FileExistsError(
            f"{side} exists and is not an embedl_dynamo export sidecar; exporting there would "
            "overwrite it. Choose another file name or move that file."
        )


def jsonable(value: Any) -> Any:
    """Report values made JSON-safe: tensors to lists, paths to strings, unknowns to repr."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


def io_specs(
    names: list[str], tensors: Sequence[torch.Tensor], batch: int | None, dynamic: bool
) -> list[dict[str, Any]]:
    """Name, shape (``batch`` where dynamic) and dtype of each input or output."""
    specs = []
    for name, t in zip(names, tensors):
        shape: list[Any] = list(t.shape)
        if dynamic and shape and batch is not None and shape[0] == batch:
            shape[0] = "batch"
        specs.append({"name": name, "shape": shape, "dtype": str(t.dtype).replace("torch.", "")})
    return specs
