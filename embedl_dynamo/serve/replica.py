"""What one serving replica does, apart from Ray: load the file, check that it answers, run
requests alone or through a batcher, and answer them as KServe v2 JSON or, for a Python caller,
in the model's own structure (as ``load()``'s module returns it).

:mod:`embedl_dynamo.serve.ray_serve` subclasses :class:`Replica` as its ``@serve.deployment``
(its :meth:`Replica.run_one` goes through ``@serve.batch``); without Ray, the same class runs
requests one by one, which is how its behaviour is tested.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from embedl_dynamo.serve.artifact import Outcome, ServedArtifact
from embedl_dynamo.serve.kserve import decode_inputs, encode_response, model_metadata

__all__ = ["Replica"]


class Replica:
    """What one replica does, apart from Ray: load the artifact, check that it answers, run
    requests (alone, or through a batcher) and answer them as KServe v2 JSON or, for a Python
    caller, in the model's own structure.

    Args:
        path: the exported ``.onnx`` file.
        name: the model's name in URLs.
        threads: the runtime's threads (None: its default).
        max_batch: the most rows one batch holds (None: the default).

    Raises:
        RuntimeError: the replica cannot answer a request
            (:meth:`~embedl_dynamo.serve.artifact.ServedArtifact.check_answers`); Serve then
            reports the deployment as failed rather than ready.
    """

    def __init__(self, path: str, name: str, threads: int | None, max_batch: int | None) -> None:
        self.name = name
        self.model = ServedArtifact(path, threads=threads, max_batch_size=max_batch)
        self.model.check_answers()

    def metadata(self) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the protocol's fields and the omitted output leaves."""
        platform = f"embedl_dynamo_{self.model.runtime}"
        fields = model_metadata(self.name, platform, self.model.inputs, self.model.outputs)
        return {**fields, **self.model.metadata_extra()}

    async def run_all(self, items: list[tuple[int, list[np.ndarray]]]) -> list[Outcome]:
        """A batch of (rows, arrays) requests, run off the event loop: each one's outputs or
        its exception."""
        return await asyncio.to_thread(self.model.run_batch, [arrays for _, arrays in items])

    async def run_one(self, rows: int, arrays: list[np.ndarray]) -> Outcome:
        """One request's outcome; the Ray deployment batches it with other clients' requests."""
        return (await self.run_all([(rows, arrays)]))[0]

    async def outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The file's own outputs for one request's input arrays.

        Raises:
            Exception: what the request failed with (ValueError: refused by ``load()``'s
                module, such as NaN on OpenVINO).
        """
        rows = self.model.rows(arrays)
        if rows > self.model.max_rows:  # more than one batch: run it alone
            outcome = (await self.run_all([(rows, arrays)]))[0]
        else:
            outcome = await self.run_one(rows, arrays)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def infer(self, arrays: list[np.ndarray]) -> Any:
        """The answer to one request's input arrays as ``load()``'s module gives it, numpy
        arrays in place of tensors: the model's structure (a dict, nested tuples, None), one
        array for a one-output model (the handle's entry point)."""
        return self.model.answer.structure(await self.outputs(arrays), arrays)

    async def infer_json(self, body: Any) -> dict[str, Any]:
        """The KServe v2 JSON response to a request body.

        Raises:
            KServeError: the request does not fit the model.
            ValueError: ``load()``'s module refuses it.
        """
        arrays = decode_inputs(body, self.model.inputs)
        answer = self.model.answer.arrays(await self.outputs(arrays), arrays)
        return encode_response(self.name, self.model.outputs, answer, body)
