"""The JSON sidecar written next to an exported file (``model.onnx`` -> ``model.json``).

It holds the plan report, the precision of every layer and why, the quantization scales, the
input and output specs, the output structure (:class:`~embedl_dynamo.graph.output_tree.OutputTree`),
the runtime the file is meant to run on (in the form of
:meth:`Runtime.to_dict <embedl_dynamo.runtimes.base.Runtime.to_dict>`), the verification
result, the settings and the library versions; ``load()`` reads it back (:func:`read_sidecar`)
and checks the file's sha256 against it, and its data file's (``model.onnx.data``, for a model
whose weights are stored beside it). On request the report page (``model.html``) is written
beside it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import atomic_write_text
from embedl_dynamo.deploy.sidecar_fields import MAX_SIDECAR_BYTES, check_fields
from embedl_dynamo.onnx.external_data import data_path
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.report.compile_report import CompileReport
from embedl_dynamo.report.html import render_html
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import AUTO, runtime_classes

__all__ = [
    "SIDECAR_FORMAT",
    "data_file_record",
    "export_runtime",
    "io_specs",
    "read_sidecar",
    "recorded_runtime",
    "refuse_foreign_sidecar",
    "runtime_record",
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


def read_sidecar(path: Path) -> tuple[dict[str, Any], str | None]:
    """The sidecar of the exported file ``path``, and why nothing can be verified against it:
    the one reader (``load()``, serving and Triton read it here), which checks every field they
    act on (:func:`~embedl_dynamo.deploy.sidecar_fields.check_fields`).

    Returns:
        ``(sidecar, None)`` for a sidecar export wrote; ``({}, reason)`` where there is none,
        it cannot be read, or it is not ours (a ``model.json`` of another tool).

    Raises:
        ValueError: our sidecar, but a field that is acted on holds what export never writes
            (``"num_threads": 100000``, a data file in another folder), or it is larger than
            :data:`~embedl_dynamo.deploy.sidecar_fields.MAX_SIDECAR_BYTES`.
    """
    side = sidecar_path(path)
    if not side.is_file():
        return {}, f"it has no sidecar {side.name} beside it"
    try:
        size = side.stat().st_size
        if size > MAX_SIDECAR_BYTES:
            raise ValueError(
                f"{side.name} holds {size} bytes, more than the {MAX_SIDECAR_BYTES} an export "
                "sidecar may; export the model again"
            )
        data = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as exc:
        return {}, f"ignoring unreadable sidecar {side}: {exc}"
    if not isinstance(data, dict):
        kind = type(data).__name__
        return {}, f"ignoring sidecar {side}: it holds a JSON {kind}, not the object export writes"
    if data.get("format") != SIDECAR_FORMAT:
        return {}, (
            f'ignoring {side}: it is not an embedl_dynamo export sidecar (no "format": '
            f'"{SIDECAR_FORMAT}")'
        )
    check_fields(data, side.name)
    return data, None


def export_runtime(target_name: str, forced: str = AUTO) -> str:
    """The runtime an export's ``.onnx`` file is meant to run on: ``forced`` (the export's
    ``runtime`` setting) where that runtime loads ``.onnx`` files, else the CPU runtime whose
    placement the target is (``openvino`` for the openvino target), else ``onnxruntime``
    (TensorRT EP > CUDA EP > CPU: the tensorrt target's file)."""
    classes = runtime_classes()
    if forced in classes and ".onnx" in classes[forced].artifact_suffixes:
        return forced
    for name, cls in classes.items():
        target = cls.cpu_target
        if target is not None and target.name == target_name and ".onnx" in cls.artifact_suffixes:
            return name
    return OnnxRuntime.name


def runtime_record(name: str, path: Path) -> dict[str, Any]:
    """The sidecar's ``runtime``: :meth:`Runtime.to_dict
    <embedl_dynamo.runtimes.base.Runtime.to_dict>`'s state for runtime ``name`` running
    ``path`` (its file name; ``load()`` runs the file it is given), no threads and no options:
    those are the loader's (``load(num_threads=..., device=...)``)."""
    return {"runtime": name, "num_threads": None, "options": {}, "artifacts": {"model": path.name}}


def recorded_runtime(sidecar: dict[str, Any]) -> str | None:
    """The runtime a sidecar says its file runs on (an older sidecar without ``runtime``:
    its target's, :func:`export_runtime`); None for no sidecar."""
    record = sidecar.get("runtime")
    if isinstance(record, dict) and isinstance(record.get("runtime"), str):
        return record["runtime"]
    backend = sidecar.get("backend")
    if isinstance(backend, dict) and isinstance(backend.get("name"), str):
        return export_runtime(backend["name"])
    return None


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
        index=0,
        backend=backend,
        runtime=f"ONNX file {path.name}",
        ops=ops,
        status="exported",
        pipeline=dict(result.report),
        compile_s=seconds,
    )
    sub.plan = result.plan
    title = f"embedl_dynamo export: {path.name}"
    atomic_write_text(page, render_html([sub], CompileReport([sub]).summary(), title=title))
    return page
