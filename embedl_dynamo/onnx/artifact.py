"""The ONNX artifact of a graph: its content key, its cached export and where its file is."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.checksums import PendingChecksum
from embedl_dynamo.cache.keys import (
    content_key,
    fingerprint_graph,
    library_versions,
)
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.errors import WeightsChangedWhileWritingError
from embedl_dynamo.graph.dynamic_axes import DynamicAxes, batch_axes
from embedl_dynamo.onnx.export import DEFAULT_OPSET, export_onnx_unwritten
from embedl_dynamo.onnx.initializers import UnwrittenOnnx
from embedl_dynamo.settings import Settings

__all__ = [
    "OnnxArtifact",
    "cached_onnx",
    "input_specs",
    "onnx_artifact",
    "recorded_digest",
    "unstored_export",
]

logger = logging.getLogger(__name__)

#: the exports whose file was not stored because a weight changed in place while it was
#: written, by key, the latest few: a refit of that build takes its graph from here
_UNSTORED: OrderedDict[str, UnwrittenOnnx] = OrderedDict()
_UNSTORED_KEPT = 4
_UNSTORED_LOCK = threading.Lock()


def _keep_unstored(key: str, unwritten: UnwrittenOnnx) -> None:
    with _UNSTORED_LOCK:
        _UNSTORED[key] = unwritten
        while len(_UNSTORED) > _UNSTORED_KEPT:
            _UNSTORED.popitem(last=False)


def unstored_export(key: str) -> Any | None:
    """The ``ModelProto`` of the export ``key`` whose file was not stored because a weight
    changed in place while it was written, with the weights' values as they are now (those
    that changed are the new ones): enough for a refit, which computes every initializer a
    weight gives again. None when there is no such export in this process."""
    with _UNSTORED_LOCK:
        unwritten = _UNSTORED.get(key)
    return unwritten.current_model() if unwritten is not None else None


def input_specs(example_inputs: list[torch.Tensor], axes: DynamicAxes) -> list[Any]:
    """dtype and shape per input, each dynamic axis read as its name (``batch``, ``s1``...)."""
    specs = []
    for t, dynamic in zip(example_inputs, axes.inputs, strict=True):
        shape: list[Any] = [dynamic.get(axis, size) for axis, size in enumerate(t.shape)]
        specs.append({"dtype": str(t.dtype), "shape": shape})
    return specs


class OnnxArtifact:
    """The ONNX file of one graph, from the cache or just exported.

    A float graph just exported is written to the cache on a helper thread; meanwhile
    :attr:`unwritten` holds the model and its weights, from which ONNX Runtime builds its
    session without reading the file. :attr:`path` waits for the file.

    Args:
        key: the content key (None for a file from elsewhere: :meth:`of_file`).
        built: exported by this call (not found in the cache).
        final: where the file is (or will be, once written).
        writing: resolves when the file is stored; None when it already is.
        unwritten: the model in memory while it is being written.
    """

    def __init__(
        self,
        key: str | None,
        built: bool,
        final: Path,
        writing: Future[Path] | None = None,
        unwritten: UnwrittenOnnx | None = None,
    ) -> None:
        self.key = key
        self.built = built
        self.final = final
        self._writing = writing
        self.unwritten = unwritten
        if writing is not None:
            writing.add_done_callback(self._written)

    @classmethod
    def of_file(cls, path: str | Path) -> OnnxArtifact:
        """An ONNX file that is already written (loaded by the user, or a derived file)."""
        return cls(None, False, Path(path))

    def _written(self, writing: Future[Path]) -> None:
        self.unwritten = None  # the file holds the weights now: let the tensors go

    @property
    def path(self) -> Path:
        """The file, once written (raises what the write raised if it failed)."""
        if self._writing is not None:
            return self._writing.result()
        return self.final


def onnx_artifact(
    gm: fx.GraphModule,
    example_inputs: list[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
    reference: Callable[[], Sequence[torch.Tensor]] | None = None,
    in_memory: bool = False,
) -> OnnxArtifact:
    """The ONNX file for ``gm`` from the artifact cache, exported under the key's lock if absent.

    A float graph's file is written on a helper thread (:meth:`ArtifactCache.get_or_start`);
    with ``in_memory`` the returned artifact's :attr:`~OnnxArtifact.unwritten` holds it
    meanwhile, for a runtime that builds from memory (ONNX Runtime on the CPU), its weights made
    contiguous once for that runtime and the writer. Without, the writer copies what it must
    on its own thread: a runtime that reads the file (OpenVINO) waits for it anyway.

    Args:
        gm: the transformed graph.
        example_inputs: one tensor per input.
        settings: the settings (cache directory, dynamic batch).
        axes: the dynamic axes (Dynamo's symbolic sizes); dim 0 by ``settings.dynamic_batch``
            when None.
        reference: gives ``gm``'s outputs on ``example_inputs`` when the export needs them
            (a runtime's :meth:`~.base.Runtime.reference_outputs`); the export runs ``gm``
            itself when None.
        in_memory: keep the export in memory while it is written (see above).
    """
    if axes is None:  # outputs' axes are decided by the export, which runs the graph anyway
        axes = batch_axes(example_inputs, (), settings.dynamic_batch)
    key = content_key(
        "onnx",
        fingerprint_graph(gm),
        input_specs(example_inputs, axes),
        axes.to_json(),
        {"opset": DEFAULT_OPSET},
        library_versions(),
    )
    cache = ArtifactCache(settings.cache_dir, "onnx")
    kept: list[UnwrittenOnnx] = []

    def _start(path: Path) -> Callable[[], None] | None:
        # the TorchScript exporter only: torch.export inside a Dynamo backend upsets Dynamo state
        outputs = reference() if reference is not None else None
        unwritten = export_onnx_unwritten(gm, example_inputs, path, axes, outputs)
        logger.info("built ONNX artifact %s", key[:16])
        if unwritten is None:
            return None
        if in_memory:
            unwritten.make_contiguous()
            kept.append(unwritten)
        pending = [unwritten]  # the writer's one reference, dropped once written

        def finish() -> None:
            export = pending.pop()
            try:
                export.write(path)
            except WeightsChangedWhileWritingError:
                _keep_unstored(key, export)
                raise

        return finish

    path, built, writing = cache.get_or_start(key, _start, ".onnx", meta={"kind": "onnx"})
    if not built:
        logger.info("reusing cached ONNX artifact %s", key[:16])
    unwritten = kept.pop() if writing is not None and kept else None
    return OnnxArtifact(key, built, path, writing, unwritten)


def cached_onnx(key: str, settings: Settings) -> tuple[Path, PendingChecksum] | None:
    """The cached ONNX file for ``key`` and its pending checksum, not started (a runtime that
    runs a file derived from it may never read it): calling it raises unless the file's checksum
    matches; None when absent or found corrupt."""
    return ArtifactCache(settings.cache_dir, "onnx").get_verifying(key, ".onnx", start=False)


def recorded_digest(key: str, settings: Settings) -> str | None:
    """The digest the cached ONNX file for ``key`` is recorded with (see
    :meth:`~embedl_dynamo.cache.store.ArtifactCache.recorded_digest`); None when absent."""
    return ArtifactCache(settings.cache_dir, "onnx").recorded_digest(key, ".onnx")
