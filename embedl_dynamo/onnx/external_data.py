"""Where the weights of a large ONNX model go: one data file per model, named after it.

A model whose weights exceed :data:`EXTERNAL_DATA_BYTES` is written as ``model.onnx`` (the graph, each initializer pointing
into the data file by offset and length) plus ``model.onnx.data`` (every weight, one after the
other), ONNX's own external-data layout (``onnx.save_model(..., all_tensors_to_one_file=True)``).
The data file is named after the model file, never after a tensor, so two models written into
one directory never share (and overwrite) a weight file; whoever moves or checksums the model
moves or checksums :func:`data_path` with it.

The bound is far below protobuf's 2 GiB limit on a serialised ``ModelProto``: ONNX Runtime
and OpenVINO read weights in a data file straight from the file (no protobuf parse copying
each one), so a session over a decoder's graph starts several times sooner from it than from
the same weights inline, and a warm start builds a session per graph.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_SUFFIX",
    "EXTERNAL_DATA_BYTES",
    "data_path",
    "external_locations",
    "file_bytes",
    "initializer_bytes",
    "save_model_file",
]

# beyond this much weight data a model is written with a data file (see the module)
EXTERNAL_DATA_BYTES = 64 * 2**20
DATA_SUFFIX = ".data"


def data_path(path: str | Path) -> Path:
    """The data file of the model at ``path``: ``model.onnx`` -> ``model.onnx.data``."""
    path = Path(path)
    return path.with_name(path.name + DATA_SUFFIX)


def file_bytes(path: str | Path) -> int:
    """The bytes of the model file at ``path`` and of its data file, where it has one."""
    data = data_path(path)
    return Path(path).stat().st_size + (data.stat().st_size if data.exists() else 0)


def initializer_bytes(model: Any) -> int:
    """The bytes of weight data the ``ModelProto`` holds in its initializers (inline)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def external_locations(model: Any) -> set[str]:
    """The external-data files the initializers of ``model`` (loaded without them) point to."""
    from onnx import TensorProto

    return {
        entry.value
        for t in model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
        for entry in t.external_data
        if entry.key == "location"
    }


def save_model_file(model: Any, path: str | Path, stale: set[str] = frozenset()) -> None:
    """Write ``model`` (weights inline) to ``path``; over :data:`EXTERNAL_DATA_BYTES` of
    weights, with every weight in :func:`data_path`, and checked with ``onnx.checker``.

    Args:
        model: the ``ModelProto``, weights loaded; its initializers may be changed to point
            to the data file.
        path: the ``.onnx`` file.
        stale: external-data files (relative to ``path``'s directory) that the model was read
            from, removed once it is written (other than the data file itself).
    """
    import onnx

    path = Path(path)
    data = data_path(path)
    if initializer_bytes(model) > EXTERNAL_DATA_BYTES:
        data.unlink(missing_ok=True)  # save_model appends to an existing data file
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path))
    for name in stale - {data.name}:
        stale_file = path.parent / name
        if stale_file.parent == path.parent:  # a plain file name beside the model
            with contextlib.suppress(OSError):
                stale_file.unlink()
