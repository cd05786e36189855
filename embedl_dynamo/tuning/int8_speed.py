"""``precision="int8"`` is never slower than float without saying so.

Where the user asks for INT8 on every layer the target quantizes, INT8 is what runs, even where
it measures slower: that choice is the user's. But a slower INT8 must not pass unnoticed (a
depthwise-heavy CNN on a CPU runtime whose integer kernels do not pay is the usual case). So once
the INT8 artifact is built and within the budget, the float graph is built on the same runtime
class (from the artifact cache when it was built before) and both are timed round-robin by the
one contest (:func:`~embedl_dynamo.tuning.runtime_choice.measure_runtimes`). Where INT8's median
is above float's, :func:`compare_with_float` logs one warning with both numbers and returns them;
the compile report's first screen says the same and points to ``precision="mixed"``, which keeps
INT8 only where it pays. The float runtime is released either way; nothing changes what runs.

The two medians are cached, keyed by the INT8 artifact, the runtime, the threads, the library
versions and the CPU model, so a later compile of the same model builds and times nothing more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, cpu_name, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.errors import error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import runtime_choice
from embedl_dynamo.tuning.judge import judge_against

__all__ = ["Int8Speed", "compare_with_float", "warn_if_slower"]

logger = logging.getLogger(__name__)

_NAMESPACE = "int8_speed"
_FORMAT = 1


@dataclass(frozen=True)
class Int8Speed:
    """INT8 and float medians (ms per call) of one graph on one runtime."""

    runtime: str
    int8_ms: float
    fp32_ms: float

    @property
    def slower(self) -> bool:
        """Whether INT8 took longer than float."""
        return self.int8_ms > self.fp32_ms

    def to_dict(self) -> dict[str, float | str]:
        """The record the subgraph report keeps (``pipeline["int8_speed"]``)."""
        return {"runtime": self.runtime, "int8_ms": self.int8_ms, "fp32_ms": self.fp32_ms}

    @classmethod
    def from_dict(cls, record: dict[str, float | str]) -> Int8Speed:
        """The speeds :meth:`to_dict` wrote."""
        return cls(str(record["runtime"]), float(record["int8_ms"]), float(record["fp32_ms"]))


def compare_with_float(
    int8: Runtime,
    float_model: fx.GraphModule,
    original: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None,
    index: int = 0,
) -> Int8Speed | None:
    """Time the built INT8 runtime against ``float_model`` built on the same runtime class.

    Args:
        int8: the INT8 runtime that runs (left active).
        float_model: the float graph INT8 was made from.
        original: the graph before any rewrite, the float artifact's reference
            (:func:`~embedl_dynamo.tuning.judge.judge_against`).
        inputs: the example inputs (timed on).
        settings: the settings (threads, cache).
        axes: the dynamic axes of the artifact.
        index: the subgraph's index, for the warning.

    Returns:
        Both medians, or None when the float graph does not build on that runtime (nothing to
        compare with; logged at debug level).
    """
    cache, key = _cache_entry(int8, settings)
    speed = _load(cache, key, int8.name)
    if speed is None:
        speed = _measure(int8, float_model, original, inputs, settings, axes, index)
        if speed is None:
            return None
        _store(cache, key, speed)
    warn_if_slower(speed, index)
    return speed


def warn_if_slower(speed: Int8Speed, index: int) -> None:
    """The one warning of a slower INT8 (at its build, and at every warm start of it)."""
    if speed.slower:
        logger.warning(
            "subgraph %d: int8 on %s measured slower than float (%.2f ms against %.2f ms); it "
            "runs as asked. precision='mixed' keeps INT8 only where it pays",
            index,
            speed.runtime,
            speed.int8_ms,
            speed.fp32_ms,
        )


def _measure(
    int8: Runtime,
    float_model: fx.GraphModule,
    original: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None,
    index: int,
) -> Int8Speed | None:
    """Build the float graph on ``int8``'s runtime class and time both (None: it fails)."""
    judge = judge_against(original, inputs, ())
    try:
        fp32 = type(int8)(settings, axes).build(float_model, list(inputs), judge)
    except Exception as exc:
        logger.debug(
            "subgraph %d: float build for the INT8 speed check failed: %s", index, error_line(exc)
        )
        return None
    try:
        timings = runtime_choice.measure_runtimes({"int8": int8, "fp32": fp32}, inputs)
    finally:
        fp32.deactivate()
        int8.activate()
    return Int8Speed(int8.name, timings["int8"], timings["fp32"])


def _cache_entry(int8: Runtime, settings: Settings) -> tuple[ArtifactCache | None, str]:
    """The cache and key of ``int8``'s record (no cache: the runtime has no artifact key)."""
    artifact = int8.key()
    if artifact is None:
        return None, ""
    key = content_key(
        _NAMESPACE,
        _FORMAT,
        int8.name,
        artifact,
        settings.num_threads,
        library_versions([type(int8)]),
        cpu_name(),
    )
    try:
        return ArtifactCache(settings.cache_dir, _NAMESPACE), key
    except OSError:
        return None, key


def _load(cache: ArtifactCache | None, key: str, runtime: str) -> Int8Speed | None:
    def read(document: dict[str, object]) -> Int8Speed:
        int8, fp32 = document["int8_ms"], document["fp32_ms"]
        if (
            document.get("format") != _FORMAT
            or not isinstance(int8, float)
            or not (isinstance(fp32, float) and fp32 > 0)
        ):
            raise ValueError(f"format {document.get('format')!r}, {int8!r} / {fp32!r} ms")
        return Int8Speed(runtime, int8, fp32)

    return None if cache is None else cache.get_json(key, read, "int8 speed record", "timing again")


def _store(cache: ArtifactCache | None, key: str, speed: Int8Speed) -> None:
    if cache is None:
        return
    document = {"format": _FORMAT, **speed.to_dict()}
    try:
        cache.put(key, json.dumps(document).encode(), ".json", meta={"kind": "int8 speed"})
    except OSError as exc:
        logger.debug("int8 speed record not cached: %s", exc)
