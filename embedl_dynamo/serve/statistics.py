"""A replica's inference statistics in the KServe v2 statistics extension's form (Triton's).

Triton answers ``GET /v2/models/<name>/stats`` and gRPC ``ModelStatistics`` with cumulative
counts and durations per stage of a request, and its clients read them
(``tritonclient.http.InferenceServerClient.get_inference_statistics``). A replica keeps the
same record, so the time a request spends in the server splits into its stages and the rest of
a client's round trip is the transport (the client, HTTP or gRPC, Ray Serve's proxy):

* ``queue``: from the request's arrival at the batcher to the start of the batch that runs it;
* ``compute_input``: reading the request (its JSON header, binary data or gRPC message) into
  arrays;
* ``compute_infer``: the batch's run of the file (every request of a batch counts the batch's
  whole run, as Triton counts it);
* ``compute_output``: the answer's arrays and encoding the response;
* ``success`` and ``fail``: a request's whole stay in the replica, by its outcome.

``inference_count`` counts batch rows answered, ``execution_count`` the runs of the file, and
``batch_stats`` the runs per number of rows. Durations are nanoseconds; ``last_inference`` is
milliseconds since the epoch. The record is per replica: with several replicas, each answers
for its own requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STAGES", "InferenceStatistics", "RequestTimes"]

#: the per-request stages of ``inference_stats``, in the order a request passes them
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class RequestTimes:
    """One request's stage durations in nanoseconds, filled in as it passes them.

    Example:
        >>> times = RequestTimes()
        >>> times.add("compute_input", 1_000)
        >>> times.ns["compute_input"]
        1000
    """

    started: int = field(default_factory=time.perf_counter_ns)
    ns: dict[str, int] = field(default_factory=dict)

    def add(self, stage: str, ns: int) -> None:
        """Count ``ns`` more nanoseconds to ``stage``."""
        self.ns[stage] = self.ns.get(stage, 0) + ns

    def elapsed(self) -> int:
        """Nanoseconds since the request arrived."""
        return time.perf_counter_ns() - self.started


def _duration(count: int = 0, ns: int = 0) -> dict[str, int]:
    return {"count": count, "ns": ns}


class InferenceStatistics:
    """Cumulative statistics of the requests a replica answered, by stage.

    Example:
        >>> stats = InferenceStatistics("resnet")
        >>> times = RequestTimes()
        >>> times.add("compute_infer", 5_000)
        >>> stats.record_batch(rows=1)
        >>> stats.record(times, rows=1, ok=True)
        >>> stats.to_kserve()["model_stats"][0]["inference_stats"]["compute_infer"]
        {'count': 1, 'ns': 5000}
    """

    def __init__(self, name: str, version: str = "1") -> None:
        self.name, self.version = name, version
        self.stages = {s: _duration() for s in ("success", "fail", *STAGES)}
        self.batches: dict[int, dict[str, int]] = {}  # rows -> runs and their duration
        self.inference_count = self.execution_count = self.last_inference = 0

    def record_batch(self, rows: int, ns: int = 0) -> None:
        """Count one run of the file over ``rows`` batch rows that took ``ns``."""
        self.execution_count += 1
        entry = self.batches.setdefault(rows, _duration())
        entry["count"] += 1
        entry["ns"] += ns

    def record(self, times: RequestTimes, rows: int, ok: bool) -> None:
        """Count one answered request: its stages, and its whole stay by its outcome."""
        outcome = self.stages["success" if ok else "fail"]
        outcome["count"] += 1
        outcome["ns"] += times.elapsed()
        self.last_inference = time.time_ns() // 1_000_000
        if not ok:
            return
        self.inference_count += rows
        for stage, ns in times.ns.items():
            self.stages[stage]["count"] += 1
            self.stages[stage]["ns"] += ns

    def model_stats(self) -> dict[str, Any]:
        """This model's entry of the extension's ``model_stats`` list."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                **{k: dict(v) for k, v in self.stages.items()},
                "cache_hit": _duration(),
                "cache_miss": _duration(),
            },
            "batch_stats": [
                {"batch_size": rows, "compute_infer": dict(entry)}
                for rows, entry in sorted(self.batches.items())
            ],
        }

    def to_kserve(self) -> dict[str, Any]:
        """The response of ``GET /v2/models/<name>/stats``."""
        return {"model_stats": [self.model_stats()]}

    def to_grpc(self, service: Any) -> Any:
        """The ``ModelStatisticsResponse`` of tritonclient's gRPC ``service`` module: the same
        fields, which the extension names alike in JSON and protobuf."""
        from google.protobuf import json_format

        return json_format.ParseDict(self.to_kserve(), service.ModelStatisticsResponse())
