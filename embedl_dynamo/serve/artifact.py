"""An exported artifact as a serving replica runs it: loaded once, batched across requests.

:class:`ServedArtifact` wraps :func:`embedl_dynamo.load` (the artifact starts without a build)
with what a server needs and ``load()`` does not say: the KServe specs of its inputs and outputs
(the model's output structure as named tensors, :mod:`embedl_dynamo.serve.outputs`), whether
requests may be stacked along a batch axis (every input and output has the export's dynamic
``batch`` axis first), the most rows a batch may hold, and :meth:`ServedArtifact.run_batch`,
which stacks requests of one shape, runs them as one batch and hands each its own rows back, or
its own error: a request ``load()``'s module refuses (NaN on OpenVINO, a wrong dtype) fails
alone, not the batch it was stacked with. :meth:`ServedArtifact.check_answers` runs one
request through the whole path before a replica says it is ready. :func:`check_artifact` is
``load()``'s integrity check and the ONNX file's parse, for a server to refuse a changed or
garbage file before it starts anything. Nothing here imports Ray:
:mod:`embedl_dynamo.serve.ray_serve` puts it behind ``@serve.batch``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from embedl_dynamo.deploy.integrity import verify_artifact
from embedl_dynamo.deploy.load import load
from embedl_dynamo.deploy.sidecar import read_sidecar
from embedl_dynamo.deploy.triton import DEFAULT_MAX_BATCH_SIZE, batch_axis_everywhere, graph_tensors
from embedl_dynamo.errors import error_line
from embedl_dynamo.serve.kserve import DATATYPES, TensorSpec, encode_response, response_bytes
from embedl_dynamo.serve.outputs import ServedOutputs

__all__ = ["Outcome", "ServedArtifact", "artifact_specs", "check_artifact"]

#: a request's outcome in a batch: the file's outputs for it, or why it failed
Outcome = list[np.ndarray] | Exception


def artifact_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec], bool]:
    """The inputs and outputs of the ONNX file at ``path`` as KServe specs, and whether every
    one of them has the dynamic batch axis first (so requests can be stacked).

    Raises:
        ValueError: not an ``.onnx`` file, or not one ONNX can read (garbage, truncated).
    """
    if path.suffix != ".onnx":
        raise ValueError(
            f"{path.name}: serving reads the model's inputs from its ONNX file; serve the .onnx "
            "file (load() still picks TensorRT's engine where one was built beside it)"
        )
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or an OSError
        raise ValueError(
            f"{path.name} is not an ONNX model ONNX can read ({error_line(exc)}); export it again"
        ) from exc
    inputs, outputs = graph_tensors(model)
    if not outputs:
        raise ValueError(f"{path.name} holds no ONNX graph with outputs; export it again")

    def spec(t) -> TensorSpec:
        return TensorSpec(t.name, t.data_type.removeprefix("TYPE_"), t.dims)

    batchable = batch_axis_everywhere(inputs, outputs, read_sidecar(path)[0])
    return [spec(t) for t in inputs], [spec(t) for t in outputs], batchable


def check_artifact(path: str | os.PathLike[str]) -> None:
    """What ``load()`` would refuse in ``path`` before any runtime reads it: its sidecar's
    fields and files against their sha256 (:func:`~embedl_dynamo.deploy.integrity.
    verify_artifact`), and the ONNX file's inputs and outputs (:func:`artifact_specs`).

    Raises:
        ValueError: the file or its sidecar fails; the message says why and the fix.
    """
    verify_artifact(Path(path))
    artifact_specs(Path(path))


def _one_row(shape: Sequence[int]) -> list[int]:
    """``shape`` with a dynamic batch axis (first) set to one row; other dynamic axes stay -1."""
    return [1 if size == -1 and axis == 0 else size for axis, size in enumerate(shape)]


class ServedArtifact:
    """An exported file, loaded for serving.

    Args:
        path: the ``.onnx`` file :func:`~embedl_dynamo.export` wrote.
        threads: the runtime's intra-op threads (and PyTorch's), so replicas sharing a node
            do not oversubscribe it; None keeps the runtime's default.
        max_batch_size: the most rows one batch holds; default 8 for a file with a dynamic
            batch axis; a file without one runs each request alone.
        device: as for :func:`~embedl_dynamo.load` (``auto``: a GPU where one is installed).

    Attributes:
        inputs: the file's inputs as KServe specs.
        outputs: the answer's tensors as KServe specs (:class:`ServedOutputs`' names).
        omitted: ``(name, value)`` of the model's output leaves that are no tensor (``None``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        threads: int | None = None,
        max_batch_size: int | None = None,
        device: str = "auto",
    ) -> None:
        self.path = Path(path)
        self.inputs, graph_outputs, self.batchable = artifact_specs(self.path)
        if threads is not None:
            torch.set_num_threads(threads)
        self.threads = threads
        self.module = load(self.path, device=device, num_threads=threads)
        self.runtime = self.module.runtime
        self.answer = ServedOutputs(self.module.output_tree, graph_outputs, self.inputs)
        self.outputs, self.omitted = self.answer.specs, self.answer.omitted
        self.max_rows = (max_batch_size or DEFAULT_MAX_BATCH_SIZE) if self.batchable else 1
        self.largest_batch = 0  # the most requests one run has stacked so far

    def rows(self, arrays: Sequence[np.ndarray]) -> int:
        """How many batch rows a request counts for (1 when requests are not stacked)."""
        return int(arrays[0].shape[0]) if self.batchable and arrays[0].ndim else 1

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One call of the artifact on numpy arrays: the file's own outputs, flat, as
        :func:`load`'s module computes them (:meth:`ServedOutputs.arrays` and
        :meth:`ServedOutputs.structure` make the answer)."""
        with torch.no_grad():
            out = self.module.run_flat(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        return [t.detach().cpu().numpy() for t in out]

    def _checked(self, arrays: Sequence[np.ndarray]) -> Exception | None:
        """Why ``load()``'s module refuses the request (None: it takes it)."""
        try:
            self.module.check_call([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        except (TypeError, ValueError) as exc:
            return exc
        return None

    def _run_alone(self, arrays: Sequence[np.ndarray]) -> Outcome:
        try:
            return self.run(arrays)
        except Exception as exc:  # noqa: BLE001 - this request's own outcome
            return exc

    def run_batch(self, requests: Sequence[Sequence[np.ndarray]]) -> list[Outcome]:
        """Each request's outputs (the file's own, as :meth:`run`), or the exception it failed
        with; requests whose inputs agree in everything but the batch size run stacked as one
        batch, the others apart, and a request the module refuses fails alone."""
        outcomes: list[Outcome] = [[] for _ in requests]
        groups: dict[tuple, list[int]] = {}
        for index, arrays in enumerate(requests):
            refused = self._checked(arrays) if self.batchable else None
            if refused is not None:
                outcomes[index] = refused
                continue
            key = tuple((a.dtype.str, a.shape[1:]) for a in arrays) if self.batchable else index
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            self.largest_batch = max(self.largest_batch, len(members))
            if len(members) == 1:
                outcomes[members[0]] = self._run_alone(requests[members[0]])
                continue
            stacked = [np.concatenate(parts) for parts in zip(*(requests[i] for i in members))]
            try:
                outputs = self.run(stacked)
            except Exception:  # noqa: BLE001 - each request's own outcome, run alone
                for i in members:
                    outcomes[i] = self._run_alone(requests[i])
                continue
            start = 0
            for i in members:
                stop = start + requests[i][0].shape[0]
                outcomes[i] = [o[start:stop] for o in outputs]
                start = stop
        return outcomes

    def check_answers(self) -> None:
        """Answer one request of zeros (one row where the batch axis is dynamic) through the
        whole path, the KServe v2 JSON included, so a replica that cannot answer fails to start
        instead of saying it is ready. Files with another dynamic axis are not run (no size is
        known to fit them); their outputs' datatypes are still checked.

        Raises:
            RuntimeError: the request fails, or an output has no KServe v2 datatype.
        """
        unknown = [s.name for s in (*self.inputs, *self.outputs) if s.datatype not in DATATYPES]
        if unknown:
            raise RuntimeError(
                f"{self.path.name}: {unknown} have no KServe v2 JSON datatype "
                f"({', '.join(DATATYPES)}); export the model with float32 inputs and outputs"
            )
        shapes = [_one_row(s.shape) for s in self.inputs]
        if any(d < 0 for shape in shapes for d in shape):
            return
        arrays = [np.zeros(shape, DATATYPES[s.datatype]) for shape, s in zip(shapes, self.inputs)]
        try:
            outputs = self.run(arrays)
            answer = self.answer.arrays(outputs, arrays)
            response_bytes(encode_response(self.path.stem, self.outputs, answer))
            self.answer.structure(outputs, arrays)
        except Exception as exc:
            raise RuntimeError(
                f"{self.path.name}: a request of zeros fails, so no request would be answered "
                f"({error_line(exc)})"
            ) from exc

    def metadata_extra(self) -> dict[str, Any]:
        """What ``GET /v2/models/<name>`` adds to the protocol's fields: the output leaves
        that are no tensor, left out of every answer, with their values."""
        return {"omitted_outputs": [{"name": n, "value": v} for n, v in self.omitted]}
