"""``runtime="auto"`` among several CPU runtimes: time the artifact on each, keep the fastest.

No CPU runtime wins everywhere. On this project's 2-core x86 CI machine, on the same float ONNX
file (medians, round-robin): OpenVINO is 15-22% faster than ONNX Runtime on BERT-base and
ViT-small and 4% on ResNet-50, ONNX Runtime 12-16% faster on MobileNetV3 and EfficientNet-B0
(depthwise convolutions). Other CPUs differ again. So where a target lists several CPU runtimes
and more than one is installed, the float artifact (exported once, shared) is built on each,
the candidates are timed round-robin on the example inputs within a small time budget, and the
fastest one runs; the losers are released.

The decision is cached, keyed by the artifact's key, the threads, the library versions and the
CPU model: a second process (or a warm start) builds only the winner and measures nothing.
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.runtimes.artifacts import onnx_artifact
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.settings import Settings

__all__ = ["RuntimeChoice", "fastest_runtime", "measure_runtimes"]

logger = logging.getLogger(__name__)

_NAMESPACE = "runtime_choice"
_FORMAT = 1
_WARMUP = 2
_MIN_ROUNDS = 3
_MAX_ROUNDS = 15
_BUDGET_S = 1.0  # timing rounds stop once this much time went into them (after _MIN_ROUNDS)


class RuntimeChoice:
    """The built, active winner, the medians per runtime (ms; empty when cached) and a note."""

    def __init__(self, runtime: Runtime, timings: dict[str, float], note: str) -> None:
        self.runtime, self.timings, self.note = runtime, timings, note


@lru_cache(maxsize=1)
def _cpu_name() -> str:
    """The CPU model (decisions do not carry over to other CPUs)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_runtimes(
    runtimes: dict[str, Runtime], inputs: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Median ms per call of each runtime, round-robin (each round calls each twice, timing the
    second: one runtime's spinning worker threads must not bill the next)."""
    for runtime in runtimes.values():
        for _ in range(_WARMUP):
            runtime.infer(*inputs)
    samples: dict[str, list[float]] = {name: [] for name in runtimes}
    spent, rounds = 0.0, 0
    while rounds < _MAX_ROUNDS and (rounds < _MIN_ROUNDS or spent < _BUDGET_S):
        for name, runtime in runtimes.items():
            runtime.infer(*inputs)
            start = time.perf_counter()
            runtime.infer(*inputs)
            elapsed = time.perf_counter() - start
            samples[name].append(elapsed)
            spent += 2 * elapsed
        rounds += 1
    return {name: statistics.median(v) * 1000.0 for name, v in samples.items()}


def _load(cache: ArtifactCache | None, key: str, names: set[str]) -> str | None:
    if cache is None:
        return None
    path = cache.get(key, ".json")
    if path is None:
        return None
    try:
        document = json.loads(path.read_text())
        name = document["runtime"]
        if document.get("format") != _FORMAT or name not in names:
            raise ValueError(f"format {document.get('format')!r}, runtime {name!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("runtime choice %s is invalid (%s); timing again", path.name, exc)
        cache.remove(key, ".json")
        return None
    return name


def fastest_runtime(
    candidates: Sequence[type[Runtime]],
    model: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
) -> RuntimeChoice:
    """Build ``model`` on each candidate CPU runtime and keep the fastest (module docstring).

    Args:
        candidates: runtime classes, best first (ties and failures favour the earlier).
        model: the float graph to run.
        inputs: its example inputs (timed on).
        settings: the settings (cache directory, threads).
        axes: the dynamic axes of the artifact.

    Returns:
        The :class:`RuntimeChoice`.

    Raises:
        Exception: what the last candidate raised, when none of them builds.
    """
    _, artifact_key, _ = onnx_artifact(model, list(inputs), settings, axes)
    key = content_key(
        _NAMESPACE, _FORMAT, artifact_key, settings.num_threads, library_versions(), _cpu_name(),
        [c.name for c in candidates],
    )  # fmt: skip
    try:
        cache = ArtifactCache(settings.cache_dir, _NAMESPACE)
    except OSError:
        cache = None
    by_name = {c.name: c for c in candidates}
    cached = _load(cache, key, set(by_name))
    order = [by_name[cached]] + [c for c in candidates if c.name != cached] if cached else []
    for cls in order[:1]:  # the cached winner: build it alone
        try:
            runtime = cls(settings, axes).build(model, inputs)
        except Exception as exc:
            logger.warning("cached runtime choice %s failed to build (%s); timing again",
                           cls.name, exc)  # fmt: skip
            break
        return RuntimeChoice(runtime, {}, f"auto: {cls.name} (timed faster here before)")
    built: dict[str, Runtime] = {}
    error: Exception | None = None
    for cls in candidates:
        try:
            built[cls.name] = cls(settings, axes).build(model, inputs)
        except Exception as exc:  # the others may still run it
            logger.info("runtime %s cannot run this graph: %s", cls.name, exc)
            error = exc
    if not built:
        assert error is not None
        raise error
    timings = measure_runtimes(built, inputs) if len(built) > 1 else {}
    winner = min(built, key=lambda n: timings.get(n, 0.0))
    for name, runtime in built.items():
        if name != winner:
            runtime.deactivate()
    if len(built) > 1 and cache is not None:
        document = {"format": _FORMAT, "runtime": winner, "ms": timings, "cpu": _cpu_name()}
        try:
            cache.put(key, json.dumps(document, indent=1).encode(), ".json",
                      meta={"kind": "runtime choice"})  # fmt: skip
        except OSError as exc:
            logger.debug("runtime choice not cached: %s", exc)
    shown = ", ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(timings.items(), key=lambda t: t[1]))
    note = f"auto: {winner}, timed fastest here ({shown})" if timings else f"auto: {winner}"
    logger.info("%s", note)
    return RuntimeChoice(built[winner], timings, note)
