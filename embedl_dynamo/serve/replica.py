"""What one serving replica does, apart from Ray: load the file, check that it answers, run
requests through a batcher, and answer them in KServe v2 (JSON, binary data, gRPC) or, for a
Python caller, in the model's own structure (as ``load()``'s module returns it).

:mod:`embedl_dynamo.serve.ray_serve` subclasses :class:`Replica` as its ``@serve.deployment``;
without Ray the same class answers the same requests, which is how its behaviour is tested.
Requests are batched by :class:`~embedl_dynamo.serve.batcher.Batcher`: a lone request runs at
once, the requests that arrive while a batch runs are stacked into the next. Every request's
stages (reading it, its queue, the run, its answer) are counted in the replica's
:class:`~embedl_dynamo.serve.statistics.InferenceStatistics`, which the statistics routes
report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from embedl_dynamo.serve.statistics import InferenceStatistics, RequestTimes

__all__ = ["Queued", "Replica"]

T = TypeVar("T")
#: a decoded request: its KServe v2 JSON header (None for a Python caller) and input arrays
Decoded = tuple[Any, list[np.ndarray]]


@dataclass
class Queued:
    """A request waiting in the replica's batcher: its batch rows, input arrays, stage times
    and when it was queued.

    Example:
        >>> import numpy as np
        >>> Queued(1, [np.zeros((1, 3), np.float32)]).rows
        1
    """

    rows: int
    arrays: list[np.ndarray]
    times: RequestTimes = field(default_factory=RequestTimes)
    submitted: int = field(default_factory=time.perf_counter_ns)


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

    Attributes:
        statistics: the requests answered so far, by stage, as the KServe v2 statistics
            extension reports them (:mod:`~embedl_dynamo.serve.statistics`).

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
        self.statistics = InferenceStatistics(name)
        self.batcher: Batcher[Queued, Outcome] = Batcher(
            self.run_all, lambda queued: queued.rows, self.model.max_rows, batch_wait_s
        )

    def metadata(self) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the protocol's fields and the omitted output leaves."""
        platform = f"embedl_dynamo_{self.model.runtime}"
        fields = model_metadata(self.name, platform, self.model.inputs, self.model.outputs)
        return {**fields, **self.model.metadata_extra()}

    async def run_all(self, queued: list[Queued]) -> list[Outcome]:
        """A batch of queued requests, run off the event loop: each one's outputs or its
        exception; each request's queue and compute times are noted on it."""
        started = time.perf_counter_ns()
        for entry in queued:
            entry.times.add("queue", started - entry.submitted)
        outcomes = await asyncio.to_thread(self.model.run_batch, [q.arrays for q in queued])
        ran = time.perf_counter_ns() - started
        self.statistics.record_batch(sum(q.rows for q in queued), ran)
        for entry in queued:
            entry.times.add("compute_infer", ran)
        return outcomes

    async def outputs(
        self, arrays: list[np.ndarray], times: RequestTimes | None = None
    ) -> list[np.ndarray]:
        """The file's own outputs for one request's input arrays, run in a batch with the
        requests queued beside it (alone when it holds more rows than a batch).

        Raises:
            Exception: what the request failed with (ValueError: refused by ``load()``'s
                module, such as NaN on OpenVINO).
        """
        queued = Queued(self.model.rows(arrays), arrays, times or RequestTimes())
        if queued.rows > self.model.max_rows:  # more than one batch: run it alone
            outcome = (await self.run_all([queued]))[0]
        else:
            outcome = await self.batcher.submit(queued)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def answered(self, decode: Callable[[], Decoded], encode: Callable[..., T]) -> T:
        """One request through the replica's stages, counted in :attr:`statistics`:
        ``decode()`` gives its header (or None) and input arrays, the batcher runs them, and
        ``encode(outputs, arrays, header)`` makes the answer.

        Raises:
            Exception: what decoding, the run or encoding raised (counted as a failure).
        """
        times, rows, ok = RequestTimes(), 0, False
        try:
            header, arrays = _timed(times, "compute_input", decode)
            rows = self.model.rows(arrays)
            outputs = await self.outputs(arrays, times)
            answer = _timed(times, "compute_output", lambda: encode(outputs, arrays, header))
            ok = True
            return answer
        finally:
            self.statistics.record(times, rows, ok)

    def kserve_arrays(self, header: Any, binary: dict[int, np.ndarray] | None) -> Decoded:
        """A KServe v2 request's header and its input arrays, checked against the file's."""
        return header, decode_inputs(header, self.model.inputs, binary)

    def kserve_parts(
        self, outputs: list[np.ndarray], arrays: list[np.ndarray], header: Any
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The KServe v2 response to a request: its JSON and the arrays that follow it as
        binary data (those the request asks for that way)."""
        answer = self.model.answer.arrays(outputs, arrays)
        return response_parts(self.name, self.model.outputs, answer, header)

    async def infer(self, arrays: list[np.ndarray]) -> Any:
        """The answer to one request's input arrays as ``load()``'s module gives it, numpy
        arrays in place of tensors: the model's structure (a dict, nested tuples, None), one
        array for a one-output model (the handle's entry point)."""

        def structure(outputs: list[np.ndarray], arrays: list[np.ndarray], _: Any) -> Any:
            return self.model.answer.structure(outputs, arrays)

        return await self.answered(lambda: (None, arrays), structure)

    async def infer_json(self, body: Any) -> dict[str, Any]:
        """The KServe v2 JSON response to a request body (every output as JSON ``data``).

        Raises:
            KServeError: the request does not fit the model.
            ValueError: ``load()``'s module refuses it.
        """

        def encode(outputs: list[np.ndarray], arrays: list[np.ndarray], header: Any) -> Any:
            answer = self.model.answer.arrays(outputs, arrays)
            return encode_response(self.name, self.model.outputs, answer, header)

        return await self.answered(lambda: self.kserve_arrays(body, None), encode)

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

        def decode() -> Decoded:
            return self.kserve_arrays(*read_request(body, header_length, content_encoding))

        def encode(outputs: list[np.ndarray], arrays: list[np.ndarray], header: Any) -> Any:
            return response_body(*self.kserve_parts(outputs, arrays, header))

        return await self.answered(decode, encode)


def _timed(times: RequestTimes, stage: str, step: Callable[[], T]) -> T:
    """``step()``, its duration counted to ``stage``."""
    started = time.perf_counter_ns()
    try:
        return step()
    finally:
        times.add(stage, time.perf_counter_ns() - started)
