"""``runtime="auto"`` among several CPU runtimes: build each way to run, keep the fastest.

No CPU runtime wins everywhere. On this project's 2-core x86 CI machine, on the same float ONNX
file (medians, round-robin): OpenVINO is 15-22% faster than ONNX Runtime on BERT-base and
ViT-small and 4% on ResNet-50, ONNX Runtime 12-16% faster on MobileNetV3 and EfficientNet-B0
(depthwise convolutions). Other CPUs differ again. So where a target lists several CPU runtimes
and more than one is installed, the ways to run a subgraph (:func:`run_options`: a float graph
on each runtime; a ``mixed`` graph on its runtime against the float graph on each other one) are
built, timed round-robin on the example inputs within a small time budget, and the fastest runs;
the others are released.

The decision is cached, keyed by the options (labels, runtimes and artifact keys), the threads,
the library versions and the CPU model: a second process (or a warm start) builds only the
winner and measures nothing.
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact, onnx_artifact
from embedl_dynamo.runtimes.base import Runtime, graph_outputs
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import LOWER_PRECISION_MARGIN, judge_artifact

__all__ = [
    "RunOption",
    "RuntimeChoice",
    "fastest",
    "fastest_runtime",
    "measure_runtimes",
    "run_options",
]

logger = logging.getLogger(__name__)

_NAMESPACE = "runtime_choice"
_FORMAT = 1
_WARMUP = 1  # each runtime ran the sample once already, when its artifact was checked
_MIN_ROUNDS = 3
_MAX_ROUNDS = 40
_BUDGET_S = 1.0  # timing rounds stop once this much time went into them (after _MIN_ROUNDS)
_CLEAR = 1.05  # ...or once the same option led every round by 5%


@dataclass(frozen=True)
class RunOption:
    """One way to run a subgraph: a runtime and the graph it runs (float, mixed...).

    Attributes:
        label: how reports name it (``openvino``, ``openvino mixed``).
        runtime: the runtime class.
        model: the graph it builds.
        handicap: its time is multiplied by this when compared (a lower precision must beat
            float by more than noise: ``mixed`` by 3%).
    """

    label: str
    runtime: type[Runtime]
    model: fx.GraphModule
    handicap: float = 1.0


@dataclass
class RuntimeChoice:
    """The winning option, its built and active runtime, the medians per option label (ms;
    empty when the choice came from the cache or nothing was timed) and a note for the report."""

    option: RunOption
    runtime: Runtime
    timings: dict[str, float]
    note: str


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


def _decided(samples: dict[str, list[float]]) -> bool:
    """Whether every round ranked the same option first by a clear margin (large models: a
    few rounds of 100+ ms settle it, and more would only lengthen the compile)."""
    rounds = list(zip(*samples.values()))
    winners = {min(range(len(r)), key=r.__getitem__) for r in rounds}
    if len(winners) != 1:
        return False
    best = winners.pop()
    return all(min(t for i, t in enumerate(r) if i != best) > r[best] * _CLEAR for r in rounds)


def measure_runtimes(
    runtimes: dict[str, Runtime], inputs: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Median ms per call of each runtime, round-robin (each round calls each twice, timing the
    second: one runtime's spinning worker threads must not bill the next). Rounds go on until
    the time budget is spent, or sooner once the ranking is clear."""
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
        if rounds >= _MIN_ROUNDS and _decided(samples):
            break
    return {name: statistics.median(v) * 1000.0 for name, v in samples.items()}


def _load(cache: ArtifactCache | None, key: str, labels: set[str]) -> str | None:
    def read(document: dict[str, Any]) -> str:
        label = document["option"]
        if document.get("format") != _FORMAT or label not in labels:
            raise ValueError(f"format {document.get('format')!r}, option {label!r}")
        return label

    return None if cache is None else cache.get_json(key, read, "runtime choice", "timing again")


def fastest(
    options: Sequence[RunOption],
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
) -> RuntimeChoice:
    """Build every option and keep the fastest one (see the module docstring).

    Args:
        options: the ways to run the subgraph, best first (ties and failures favour the
            earlier); labels must differ.
        inputs: the example inputs (timed on).
        settings: the settings (cache directory, threads).
        axes: the dynamic axes of the artifacts.

    Returns:
        The :class:`RuntimeChoice`.

    Raises:
        Exception: what the last option raised, when none of them builds.
    """
    # one run of each graph on the sample and one export, shared by every runtime's build
    outputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def outputs_of(model: fx.GraphModule) -> tuple[torch.Tensor, ...]:
        if id(model) not in outputs:
            outputs[id(model)] = graph_outputs(model, inputs)
        return outputs[id(model)]

    exported: dict[int, OnnxArtifact] = {}
    for o in options:
        if id(o.model) not in exported:
            in_memory = any(
                p.runtime.builds_from_memory()
                for p in options
                if p.model is o.model and issubclass(p.runtime, OnnxArtifactRuntime)
            )
            exported[id(o.model)] = onnx_artifact(
                o.model,
                list(inputs),
                settings,
                axes,
                reference=lambda m=o.model: outputs_of(m),
                in_memory=in_memory,
            )
    artifacts = [exported[id(o.model)].key for o in options]

    def runtime_of(option: RunOption) -> Runtime:
        runtime = option.runtime(settings, axes)
        if isinstance(runtime, OnnxArtifactRuntime):
            runtime.use_artifact(exported[id(option.model)])
        if id(option.model) in outputs:
            runtime.share_reference(option.model, inputs, outputs[id(option.model)])
        return runtime

    key = content_key(
        _NAMESPACE, _FORMAT, [[o.label, o.runtime.name, a] for o, a in zip(options, artifacts)],
        settings.num_threads, library_versions(), _cpu_name(),
    )  # fmt: skip
    try:
        cache = ArtifactCache(settings.cache_dir, _NAMESPACE)
    except OSError:
        cache = None
    by_label = {o.label: o for o in options}
    cached = _load(cache, key, set(by_label)) if len(options) > 1 else None
    if cached is not None:  # the cached winner: build it alone
        option = by_label[cached]
        try:
            runtime = runtime_of(option).build(option.model, inputs, judge_artifact)
        except Exception as exc:
            logger.warning("cached runtime choice %s failed to build (%s); timing again",
                           cached, exc)  # fmt: skip
        else:
            return RuntimeChoice(option, runtime, {}, f"auto: {cached} (timed fastest here before)")
    built: dict[str, Runtime] = {}
    error: Exception | None = None
    for option in options:
        try:
            built[option.label] = runtime_of(option).build(option.model, inputs, judge_artifact)
        except Exception as exc:  # the others may still run it
            logger.info("%s cannot run this graph: %s", option.label, exc)
            error = exc
    if not built:
        assert error is not None
        raise error
    timings = measure_runtimes(built, inputs) if len(built) > 1 else {}
    winner = min(built, key=lambda label: timings.get(label, 0.0) * by_label[label].handicap)
    for label, runtime in built.items():
        if label != winner:
            runtime.deactivate()
    if len(built) > 1 and cache is not None:
        document = {"format": _FORMAT, "option": winner, "ms": timings, "cpu": _cpu_name()}
        try:
            cache.put(key, json.dumps(document, indent=1).encode(), ".json",
                      meta={"kind": "runtime choice"})  # fmt: skip
        except OSError as exc:
            logger.debug("runtime choice not cached: %s", exc)
    shown = ", ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(timings.items(), key=lambda t: t[1]))
    note = f"auto: {winner}, timed fastest here ({shown})" if timings else f"auto: {winner}"
    logger.info("%s", note)
    return RuntimeChoice(by_label[winner], built[winner], timings, note)


def fastest_runtime(
    candidates: Sequence[type[Runtime]],
    model: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
) -> RuntimeChoice:
    """:func:`fastest` of ``model`` on each of ``candidates`` (labelled by runtime name)."""
    return fastest([RunOption(c.name, c, model) for c in candidates], inputs, settings, axes)


def run_options(
    model: fx.GraphModule,
    float_model: fx.GraphModule | None,
    runtime_cls: type[Runtime],
    timed: list[type[Runtime]],
    precision: str,
) -> list[RunOption]:
    """The ways to run ``model`` that :func:`fastest` chooses among (one: nothing to time).

    A float graph runs on the fastest CPU runtime; a ``mixed`` graph on its runtime competes
    with the float graph on every other CPU runtime (``mixed`` is the fastest within the budget
    on its runtime, the float graph there included, and float on another runtime can be
    faster); ``int8``, ``fp16`` and ``bf16`` are what was asked.
    """
    if not timed:
        return [RunOption(runtime_cls.name, runtime_cls, model)]
    if float_model is None:
        return [RunOption(c.name, c, model) for c in timed]
    if precision != "mixed":
        return [RunOption(runtime_cls.name, runtime_cls, model)]
    mixed = RunOption(
        f"{runtime_cls.name} mixed", runtime_cls, model, handicap=1 / LOWER_PRECISION_MARGIN
    )
    others = [c for c in timed if c is not runtime_cls]
    return [mixed, *(RunOption(f"{c.name} fp32", c, float_model) for c in others)]
