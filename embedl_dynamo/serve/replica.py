"""What one serving replica does, apart from Ray: load the file, check that it answers, run
requests through a batcher, and answer them in KServe v2 (JSON, binary data, gRPC) or, for a
Python caller, in the model's own structure (as ``load()``'s module returns it).

:mod:`embedl_dynamo.serve.ray_serve` subclasses :class:`Replica` as its ``@serve.deployment``;
without Ray the same class answers the same requests, which is how its behaviour is tested.
Requests are batched by :class:`~embedl_dynamo.serve.batcher.Batcher`: a lone request runs at
once, the requests that arrive while a batch runs are stacked into the next.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from embedl_dynamo.serve.artifact import Outcome, ServedArtifact
from embedl_dynamo.serve.batcher import Batcher
from embedl_dynamo.serve.binary import read_request, response_body
from embedl_dynamo.serve.grpc_ingress import KServeGrpc
from embedl_dynamo.serve.kserve import (
    decode_inputs,
    encode_response,
    model_metadata,
    response_parts,
)

__all__ = ["Replica"]


class Replica(KServeGrpc):
    """What one replica does, apart from Ray: load the artifact, check that it answers, run
    requests through a batcher and answer them in KServe v2 (JSON, binary data, gRPC's
    methods from :class:`~embedl_dynamo.serve.grpc_ingress.KServeGrpc`) or, for a Python
    caller, in the model's own structure.

    Args:
        path: the exported ``.onnx`` file.
        name: the model's name in URLs.
        threads: the runtime's threads (None: its default).
        max_batch: the most rows one batch holds (None: the default).
        batch_wait_s: how long a batch with room waits for more requests (0: a batch starts
            as soon as the one before it ends, with every request queued by then).

    Raises:
        RuntimeError: the replica cannot answer a request
            (:meth:`~embedl_dynamo.serve.artifact.ServedArtifact.check_answers`); Serve then
            reports the deployment as failed rather than ready.
    """

    def __init__(
        self,
        path: str,
        name: str,
        threads: int | None,
        max_batch: int | None,
        batch_wait_s: float = 0.0,
    ) -> None:
        self.name = name
        self.model = ServedArtifact(path, threads=threads, max_batch_size=max_batch)
        self.model.check_answers()
        self.batcher: Batcher[tuple[int, list[np.ndarray]], Outcome] = Batcher(
            self.run_all, lambda item: item[0], self.model.max_rows, batch_wait_s
        )

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
        """One request's outcome, run in a batch with the requests queued beside it."""
        return await self.batcher.submit((rows, arrays))

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

    async def answer_arrays(
        self, header: Any, binary: dict[int, np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """The answer's arrays (one per output spec) for a request's JSON and binary inputs."""
        arrays = decode_inputs(header, self.model.inputs, binary)
        return self.model.answer.arrays(await self.outputs(arrays), arrays)

    async def respond(
        self, header: Any, binary: dict[int, np.ndarray] | None = None
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The KServe v2 response to a request: its JSON and the arrays that follow it as
        binary data (those the request asks for that way)."""
        answer = await self.answer_arrays(header, binary)
        return response_parts(self.name, self.model.outputs, answer, header)

    async def infer_json(self, body: Any) -> dict[str, Any]:
        """The KServe v2 JSON response to a request body (every output as JSON ``data``).

        Raises:
            KServeError: the request does not fit the model.
            ValueError: ``load()``'s module refuses it.
        """
        answer = await self.answer_arrays(body)
        return encode_response(self.name, self.model.outputs, answer, body)

    async def infer_bytes(
        self, body: bytes, header_length: str | None = None, content_encoding: str | None = None
    ) -> tuple[bytes, int | None]:
        """The HTTP response body to an HTTP request body, JSON or with binary data
        (:mod:`~embedl_dynamo.serve.binary`), and the length of its JSON header for
        ``Inference-Header-Content-Length`` (None: the body is JSON alone).

        Raises:
            KServeError: the request does not fit the model or does not add up.
            ValueError: ``load()``'s module refuses it.
        """
        header, binary = read_request(body, header_length, content_encoding)
        return response_body(*await self.respond(header, binary))
