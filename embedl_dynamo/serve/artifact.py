"""An exported artifact as a serving replica runs it: loaded once, batched across requests.

:class:`ServedArtifact` wraps :func:`embedl_dynamo.load` (the artifact starts without a build)
with what a server needs and ``load()`` does not say: the KServe specs of its inputs and outputs,
whether requests may be stacked along a batch axis (every input and output has the export's
dynamic ``batch`` axis first), the most rows a batch may hold, and :meth:`ServedArtifact.run_batch`,
which stacks requests of one shape, runs them as one batch and hands each its own rows back.
Nothing here imports Ray: :mod:`embedl_dynamo.serve.ray_serve` puts it behind ``@serve.batch``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

from embedl_dynamo.deploy.load import load
from embedl_dynamo.deploy.triton import (
    DEFAULT_MAX_BATCH_SIZE,
    batch_axis_everywhere,
    graph_tensors,
    read_sidecar,
)
from embedl_dynamo.serve.kserve import TensorSpec

__all__ = ["ServedArtifact", "artifact_specs"]


def artifact_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec], bool]:
    """The inputs and outputs of the ONNX file at ``path`` as KServe specs, and whether every
    one of them has the dynamic batch axis first (so requests can be stacked)."""
    if path.suffix != ".onnx":
        raise ValueError(
            f"{path.name}: serving reads the model's inputs from its ONNX file; serve the .onnx "
            "file (load() still picks TensorRT's engine where one was built beside it)"
        )
    inputs, outputs = graph_tensors(onnx.load(str(path), load_external_data=False))

    def spec(t) -> TensorSpec:
        return TensorSpec(t.name, t.data_type.removeprefix("TYPE_"), t.dims)

    batchable = batch_axis_everywhere(inputs, outputs, read_sidecar(path))
    return [spec(t) for t in inputs], [spec(t) for t in outputs], batchable


class ServedArtifact:
    """An exported file, loaded for serving.

    Args:
        path: the ``.onnx`` file :func:`~embedl_dynamo.export` wrote.
        threads: the runtime's intra-op threads (and PyTorch's), so replicas sharing a node
            do not oversubscribe it; None keeps the runtime's default.
        max_batch_size: the most rows one batch holds; default 8 for a file with a dynamic
            batch axis; a file without one runs each request alone.
        device: as for :func:`~embedl_dynamo.load` (``auto``: a GPU where one is installed).
    """

    def __init__(
        self, path: str | os.PathLike[str], threads: int | None = None,
        max_batch_size: int | None = None, device: str = "auto",
    ) -> None:  # fmt: skip
        self.path = Path(path)
        self.inputs, self.outputs, self.batchable = artifact_specs(self.path)
        if threads is not None:
            torch.set_num_threads(threads)
        self.threads = threads
        self.module = load(self.path, device=device, num_threads=threads)
        self.runtime = self.module.runtime
        self.max_rows = (max_batch_size or DEFAULT_MAX_BATCH_SIZE) if self.batchable else 1
        self.largest_batch = 0  # the most requests one run has stacked so far

    def rows(self, arrays: Sequence[np.ndarray]) -> int:
        """How many batch rows a request counts for (1 when requests are not stacked)."""
        return int(arrays[0].shape[0]) if self.batchable and arrays[0].ndim else 1

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One call of the artifact on numpy arrays, as :func:`load`'s module computes it."""
        with torch.no_grad():
            out = self.module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        out = (out,) if isinstance(out, torch.Tensor) else out
        return [t.detach().cpu().numpy() for t in out]

    def run_batch(self, requests: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Each request's outputs; requests whose inputs agree in everything but the batch size
        run stacked as one batch, the others apart."""
        if not self.batchable:
            self.largest_batch = max(self.largest_batch, 1)
            return [self.run(r) for r in requests]
        groups: dict[tuple, list[int]] = {}
        for index, arrays in enumerate(requests):
            key = tuple((a.dtype.str, a.shape[1:]) for a in arrays)
            groups.setdefault(key, []).append(index)
        results: list[list[np.ndarray]] = [[] for _ in requests]
        for members in groups.values():
            if len(members) == 1:
                results[members[0]] = self.run(requests[members[0]])
                self.largest_batch = max(self.largest_batch, 1)
                continue
            stacked = [np.concatenate(parts) for parts in zip(*(requests[i] for i in members))]
            self.largest_batch = max(self.largest_batch, len(members))
            outputs = self.run(stacked)
            start = 0
            for i in members:
                stop = start + requests[i][0].shape[0]
                results[i] = [o[start:stop] for o in outputs]
                start = stop
        return results
