"""The JSON sidecar written next to an exported file (``model.onnx`` -> ``model.json``).

It holds the plan report, the precision of every layer and why, the quantization scales, the
input and output specs, the verification result, the settings and the library versions;
``load()`` reads it back and checks the file's sha256 against it, and its data file's
(``model.onnx.data``, for a model whose weights are stored beside it). On request the report page
(``model.html``) is written beside it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.cache.files import atomic_write_text
from embedl_dynamo.cache.keys import sha256_file
from embedl_dynamo.onnx.external_data import data_path
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.report.compile_report import CompileReport
from embedl_dynamo.report.html import render_html
from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = [
    "SIDECAR_FORMAT",
    "data_file_record",
    "io_specs",
    "refuse_foreign_sidecar",
    "sidecar_path",
    "write_report_page",
]

SIDECAR_FORMAT = "embedl_dynamo.export/1"


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar of an exported file: ``model.onnx`` -> ``model.json``."""
    return Path(path).with_suffix(".json")


def data_file_record(path: Path) -> dict[str, str | None]:
    """The sidecar's ``onnx_data_file`` and ``onnx_data_sha256``: the model's data file
    (:func:`~embedl_dynamo.onnx.external_data.data_path`) and its sha256, None without one."""
    data = data_path(path)
    if not data.is_file():
        return {"onnx_data_file": None, "onnx_data_sha256": None}
    return {"onnx_data_file": data.name, "onnx_data_sha256": sha256_file(data)}


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


def io_specs(
    names: list[str],
    tensors: Sequence[torch.Tensor],
    batch: int | None,
    dynamic: bool,
    axes: Sequence[Mapping[int, str]] | None = None,
) -> list[dict[str, Any]]:
    """Name, shape (an axis's name where it is dynamic: ``batch``, or as ``axes`` names it)
    and dtype of each input or output."""
    specs = []
    for index, (name, t) in enumerate(zip(names, tensors)):
        shape: list[Any] = list(t.shape)
        if dynamic and shape and batch is not None and shape[0] == batch:
            shape[0] = "batch"
        for axis, axis_name in (axes[index] if axes is not None else {}).items():
            shape[axis] = axis_name
        specs.append({"name": name, "shape": shape, "dtype": str(t.dtype).replace("torch.", "")})
    return specs


def write_report_page(path: Path, backend: str, result: PipelineResult, seconds: float) -> Path:
    """``model.html`` beside ``model.onnx``: the report page of this export (atomic write).

    One self-contained page (:mod:`embedl_dynamo.report.html`): the plan, each layer's
    precision and why, and the per-layer latencies where they were measured.
    """
    page = path.with_suffix(".html")
    ops = sum(n.op.startswith("call") for n in result.model.graph.nodes)
    sub = SubgraphReport(
        index=0, backend=backend, runtime=f"ONNX file {path.name}", ops=ops, status="exported",
        pipeline=dict(result.report), compile_s=seconds,
    )  # fmt: skip
    sub.plan = result.plan
    title = f"embedl_dynamo export: {path.name}"
    atomic_write_text(page, render_html([sub], CompileReport([sub]).summary(), title=title))
    return page
