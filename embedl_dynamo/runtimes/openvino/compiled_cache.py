"""OpenVINO's compiled models kept in the artifact cache, so that a warm start imports one.

Reading an ONNX file through OpenVINO's frontend and compiling it for the CPU plugin is most of
what a warm start spends outside Dynamo's own trace; importing the plugin's exported compiled
model (``CompiledModel.export_model`` / ``Core.import_model``, the format OpenVINO's own
``CACHE_DIR`` stores) skips both. This module keeps those exports in this package's cache, not
in a ``CACHE_DIR`` of OpenVINO's, so they follow the cache's rules: content-keyed, written
atomically with a checksum sidecar that is checked on every read, kept within the size budget,
and never written in a read-only cache (a replica that ships one uses what it holds).

An entry is keyed by the digest the ONNX artifact is recorded with in the cache (an artifact
replaced by other bytes under its key is never served the old file's model), the device, every property the model is
compiled with (precision hint, threads, static shapes) and what decides the plugin's code: the
OpenVINO version, the CPU's name and its instruction-set flags. Only artifacts of this
package's cache are kept (a file ``load()`` reads from elsewhere is compiled as it is), and only
up to :data:`MAX_ARTIFACT_BYTES`, since an export holds the weights a second time, where the
cache's budget has room for it without evicting an entry used since this process started (a
derived entry is evicted first: :mod:`~embedl_dynamo.cache.budget`). The
``build_info`` entries :func:`~.compile.compile_openvino` fills (the precision hint and what
was lowered) are stored beside the export and restored with it.

A compiled model holding a recurrent layer (the CPU plugin's ``RNNSeq``/``RNNCell``, from
ONNX's ``LSTM``, ``GRU`` and ``RNN``) is not stored: OpenVINO's import of one
exported for static sizes computes other values than the model it was exported from (a
one-directional LSTM, GRU or RNN; the compile from the ONNX file is right), so such a model is
compiled from its file on every start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.files import tell_unstored
from embedl_dynamo.cache.keys import content_key, cpu_identity
from embedl_dynamo.cache.store import DERIVED_FROM, ArtifactCache
from embedl_dynamo.onnx.external_data import file_bytes
from embedl_dynamo.runtimes.openvino.compile import compile_openvino

__all__ = ["BLOB_MAPPING", "MAX_ARTIFACT_BYTES", "compile_or_import"]

logger = logging.getLogger(__name__)

#: the attribute of an imported compiled model that holds the mapped blob it reads
BLOB_MAPPING = "embedl_blob_mapping"
#: ONNX artifacts up to this size keep their compiled model in the cache
MAX_ARTIFACT_BYTES = 1 << 30
_NAMESPACE = "openvino_compiled"
_FORMAT = 1
_SUFFIX = ".blob"
_INFO_KEYS = ("inference_precision", "half_precision_note", "openvino_lowering", "static_shapes")
#: the CPU plugin's layers whose imported form is not the compiled one (see the module)
_NOT_IMPORTED = frozenset({"RNNSeq", "RNNCell"})


def _holds_recurrent(compiled: Any) -> bool:
    """Whether ``compiled``'s runtime model holds a layer of :data:`_NOT_IMPORTED`."""
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in _NOT_IMPORTED:
            return True
    return False


def _entry(cache_dir: Path, artifact_digest: str, settings: dict[str, Any]) -> tuple[Any, str]:
    """The cache (None when it cannot be opened) and the key of a compiled model."""
    import openvino as ov

    key = content_key(
        _NAMESPACE, _FORMAT, artifact_digest, settings, ov.get_version(), cpu_identity()
    )
    try:
        return ArtifactCache(cache_dir, _NAMESPACE), key
    except OSError:
        return None, key


def _imported(cache: ArtifactCache, key: str, device: str, threads: int | None) -> Any:
    """The compiled model stored under ``key`` with its ``build_info`` entries, or None.

    The import is given the precision hint the model was compiled with: the CPU plugin
    applies its own default to an imported model otherwise (bf16 on CPUs that compute in it).
    It reads the blob where it is mapped (a private, copy-on-write ``mmap``, as OpenVINO maps
    the weights of the files it reads itself) instead of a copy of its bytes, and keeps using
    that memory: the mapping is the compiled model's :data:`BLOB_MAPPING` attribute and lives
    as long as it does. The cache replaces an entry by renaming a new file over it, never by
    writing it in place, so the mapped bytes stay the ones verified.
    """
    import numpy as np
    import openvino as ov

    path = cache.get(key, _SUFFIX)  # checked before OpenVINO parses it: a bad blob could crash it
    if path is None:
        return None
    stored = cache.metadata(key, _SUFFIX).get("build_info", {})
    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": stored.get("inference_precision")}
    if threads and device == "CPU":
        properties["INFERENCE_NUM_THREADS"] = threads
    try:
        if not isinstance(properties["INFERENCE_PRECISION_HINT"], str):
            raise ValueError("its entry records no precision hint")
        blob = np.memmap(path, dtype=np.uint8, mode="c")
        compiled = ov.Core().import_model(ov.Tensor(blob, shared_memory=True), device, properties)
        setattr(compiled, BLOB_MAPPING, blob)
    except (OSError, RuntimeError, ValueError) as exc:
        logger.warning("compiled OpenVINO model %s not used (%s); compiling again", path, exc)
        return None
    return compiled, stored


def compile_or_import(
    path: Path,
    artifact_digest: str | None,
    confirm_artifact: Callable[[], None],
    cache_dir: Path,
    info: dict[str, Any],
    **options: Any,
) -> Any:
    """:func:`~.compile.compile_openvino` of ``path`` with ``options``, or the compiled model
    a build of the same artifact with the same options stored in the cache (see the module).

    Args:
        path: the ONNX file.
        artifact_digest: the digest it is recorded with in this package's cache (None: a file
            from elsewhere: compile, keep nothing).
        confirm_artifact: confirms the file's checksum (raises if it does not match); a
            compiled model is stored only after it returns.
        cache_dir: the cache root.
        info: ``build_info``, which gets what :func:`~.compile.compile_openvino` records.
        options: ``num_threads``, ``hint``, ``shapes``, ``device`` for
            :func:`~.compile.compile_openvino`.
    """
    if artifact_digest is None or file_bytes(path) > MAX_ARTIFACT_BYTES:
        return compile_openvino(path, info=info, **options)
    shapes = options.get("shapes")
    keyed = {**options, "shapes": [list(s) for s in shapes] if shapes else None}
    cache, key = _entry(cache_dir, artifact_digest, keyed)
    if cache is not None:
        device, threads = options.get("device", "CPU"), options.get("num_threads")
        found = _imported(cache, key, device, threads)
        if found is not None:
            compiled, stored = found
            info.update(stored)
            info["openvino_compiled_model"] = "imported from the cache"
            return compiled
    compiled = compile_openvino(path, info=info, **options)
    if cache is not None and not cache.read_only and not _holds_recurrent(compiled):
        stored = {k: info[k] for k in _INFO_KEYS if k in info}
        confirm_artifact()
        try:
            blob = compiled.export_model()
            data = blob.getvalue()
            if cache.room_for_derived(len(data)):
                meta = {
                    "kind": "openvino compiled model",
                    "build_info": stored,
                    "derived": True,
                    DERIVED_FROM: artifact_digest,
                }
                cache.put(key, data, _SUFFIX, meta=meta)
        except (OSError, RuntimeError) as exc:
            tell_unstored("OpenVINO's compiled model", cache_dir, exc)
    return compiled
