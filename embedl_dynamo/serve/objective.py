"""The serving objective: lowest latency per request, or most samples per second within a budget.

``objective="latency"`` is what :func:`embedl_dynamo.load` does today: one request at a time,
every CPU on it. ``objective="throughput"`` (AITune's ``MaxThroughput`` / ``LatencyBudget``)
measures the file on this machine over the batch sizes it accepts and the ways to split the
CPUs between parallel workers (``workers x threads = cpus``: one worker with every thread, or
one per CPU, ...), and keeps the one with the most samples/s whose p99 latency per batch stays
within ``latency_budget_ms``. The serving deployment then uses its batch as the most rows a
batch holds and its threads as the CPUs (and threads) per replica.

The decision is cached like the runtime choice, keyed by the file's bytes, the candidates, the
budget, the CPU model and the library versions; a cached decision measures nothing.
:func:`write_triton_for_objective` gives the same decision to a Triton model repository: its
batch as the dynamic batcher's preferred size (warmed up before the model is ready), its
workers as instances, its threads per instance.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.keys import content_key, cpu_name, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.deploy.triton import DEFAULT_MAX_BATCH_SIZE, write_triton_repository
from embedl_dynamo.serve.artifact import ServedArtifact, artifact_specs

__all__ = ["OBJECTIVES", "ServingChoice", "choose_serving", "write_triton_for_objective"]

logger = logging.getLogger(__name__)

OBJECTIVES = ("latency", "throughput")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
_FORMAT = 1


@dataclass(frozen=True)
class ServingChoice:
    """What to serve with: ``batch`` rows per batch, ``threads`` per worker (replica).

    ``candidates`` holds every measured ``{batch, threads, workers, samples_s, p99_ms}``;
    ``note`` says how the choice was made.
    """

    objective: str
    batch: int
    threads: int
    samples_s: float
    p99_ms: float
    note: str
    candidates: list[dict[str, Any]] = field(default_factory=list)


def _splits(cpus: int) -> list[int]:
    """Threads per worker such that workers x threads = cpus."""
    return [t for t in range(cpus, 0, -1) if cpus % t == 0]


def _measure(path: Path, batch: int, threads: int, workers: int, runs: int) -> dict[str, Any]:
    """``workers`` loaded copies of the file, each with ``threads`` threads, each running
    ``runs`` batches of ``batch`` rows at once: samples/s over all, p99 ms per batch."""
    kept = torch.get_num_threads()  # ServedArtifact sets PyTorch's threads, as a replica does
    try:
        models = [ServedArtifact(path, threads, batch) for _ in range(workers)]
    finally:
        torch.set_num_threads(kept)
    rng = np.random.default_rng(0)
    shapes = [
        [batch if d == -1 and i == 0 else (d if d > 0 else 1) for i, d in enumerate(spec.shape)]
        for spec in models[0].inputs
    ]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    latencies: list[float] = []
    lock = threading.Lock()

    def work(model: ServedArtifact) -> None:
        mine = []
        for _ in range(runs):
            start = time.perf_counter()
            model.run(arrays)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    for model in models:
        model.run(arrays)  # warm-up, untimed
    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - start
    p99 = float(np.percentile(latencies, 99)) * 1e3
    rows = arrays[0].shape[0] if arrays[0].ndim else 1  # a static batch's own size
    return {
        "batch": batch,
        "threads": threads,
        "workers": workers,
        "samples_s": workers * runs * rows / wall,
        "p99_ms": p99,
    }


def _pick(candidates: list[dict[str, Any]], budget: float | None) -> tuple[dict[str, Any], str]:
    within = [c for c in candidates if budget is None or c["p99_ms"] <= budget]
    if within:
        best = max(within, key=lambda c: c["samples_s"])
        where = "" if budget is None else f" with p99 within {budget:g} ms"
        return best, f"throughput: the most samples/s{where} of {len(candidates)} measured"
    best = min(candidates, key=lambda c: c["p99_ms"])
    return best, (
        f"throughput: no setting keeps p99 within {budget:g} ms; the lowest p99 "
        f"({best['p99_ms']:.1f} ms) of {len(candidates)} measured"
    )


def choose_serving(
    path: str | os.PathLike[str],
    *,
    objective: str = "throughput",
    latency_budget_ms: float | None = None,
    cpus: int | None = None,
    batch_sizes: Sequence[int] | None = None,
    runs: int = 10,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ServingChoice:
    """The batch size and threads per worker to serve ``path`` with on this machine.

    Args:
        path: the exported ``.onnx`` file.
        objective: ``latency`` (batch 1, every CPU on one request; nothing is measured) or
            ``throughput``.
        latency_budget_ms: the most a batch may take at p99 (``throughput`` only).
        cpus: the CPUs to fill (default: this machine's).
        batch_sizes: the batch sizes to try (default 1 to 32; only 1 for a file without a
            dynamic batch axis).
        runs: timed batches per worker and candidate.
        cache_dir: the decision cache (default: the user cache).

    Returns:
        A :class:`ServingChoice`.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: choose one of {', '.join(OBJECTIVES)}")
    cpus = cpus or os.cpu_count() or 1
    if objective == "latency":
        note = "latency: one request at a time, every CPU on it"
        return ServingChoice("latency", 1, cpus, float("nan"), float("nan"), note)
    path = Path(path)
    sizes = sorted(set(batch_sizes or BATCH_SIZES)) if artifact_specs(path)[2] else [1]
    key = content_key(
        "serving_choice",
        _FORMAT,
        sha256_file(path),
        sizes,
        cpus,
        latency_budget_ms,
        cpu_name(),
        library_versions(),
    )
    cache = ArtifactCache(cache_dir, "serving_choice")
    cached = cache.get_json(key, _read, "serving choice", "measuring again")
    if cached is not None:
        return cached
    candidates = [_measure(path, b, t, cpus // t, runs) for b in sizes for t in _splits(cpus)]
    best, note = _pick(candidates, latency_budget_ms)
    choice = ServingChoice(
        "throughput",
        best["batch"],
        best["threads"],
        best["samples_s"],
        best["p99_ms"],
        note,
        candidates,
    )
    logger.info("serving choice for %s: %s", path.name, note)
    try:
        cache.put(
            key,
            json.dumps({"format": _FORMAT, **asdict(choice)}).encode(),
            ".json",
            meta={"kind": "serving choice"},
        )
    except OSError as exc:
        logger.debug("serving choice not cached: %s", exc)
    return choice


def _read(document: dict[str, Any]) -> ServingChoice:
    if document.get("format") != _FORMAT:
        raise ValueError(f"format {document.get('format')!r}")
    fields = {k: document[k] for k in ServingChoice.__dataclass_fields__}
    note = f"{fields['note']} (cached decision for this file on this CPU; not measured)"
    return ServingChoice(**{**fields, "note": note})


def write_triton_for_objective(
    path: str | os.PathLike[str],
    repository: str | os.PathLike[str],
    *,
    objective: str = "throughput",
    latency_budget_ms: float | None = None,
    cpus: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Path:
    """A Triton model repository for ``path`` set up as :func:`choose_serving` decides here:
    ``instances`` = its workers, ``threads`` = its threads per worker and, for a file Triton
    batches, its batch as ``preferred_batch_size`` (``max_batch_size`` at least that), each
    batch size warmed up before the model is ready.

    Args:
        path, repository: as for :func:`~embedl_dynamo.deploy.triton.write_triton_repository`.
        objective, latency_budget_ms, cpus, cache_dir: as for :func:`choose_serving` (``cpus``:
            the CPUs Triton's instances share).
        options: more of ``write_triton_repository``'s arguments (``name``, ``backend``, ...);
            they override the decision's.

    Returns:
        The model's directory in the repository.
    """
    cpus = cpus or os.cpu_count() or 1
    choice = choose_serving(
        path,
        objective=objective,
        latency_budget_ms=latency_budget_ms,
        cpus=cpus,
        cache_dir=cache_dir,
    )
    settings: dict[str, Any] = {
        "instances": max(1, cpus // choice.threads),
        "threads": choice.threads,
    }
    if artifact_specs(Path(path))[2]:
        settings["max_batch_size"] = max(choice.batch, DEFAULT_MAX_BATCH_SIZE)
        settings["preferred_batch_sizes"] = [choice.batch]
    logger.info("Triton settings for %s: %s (%s)", Path(path).name, settings, choice.note)
    return write_triton_repository(path, repository, **{**settings, **options})
