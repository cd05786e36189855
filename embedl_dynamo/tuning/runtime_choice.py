"""``runtime="auto"`` among several CPU runtimes: build each way to run, keep the fastest.

No CPU runtime wins everywhere: OpenVINO tends to lead on transformers and plain convolutions,
ONNX Runtime on depthwise convolutions, and other CPUs differ again (``python -m bench run transformers`` measures them).
So where a target lists several CPU runtimes and more than one is installed, the ways to run a
subgraph (:func:`run_options`: a float graph on each runtime; a ``mixed`` graph on its runtime
against the float graph on each other one) are built, timed on the example inputs and the
fastest runs (:mod:`.timer`: the contest every speed decision uses); the others are released.

Two cheap ways settle it without the contest (:mod:`.runtime_rules`), and the report's note says
which one did:

* the decision is cached, keyed by the options (labels, runtimes and each graph's
  *architecture*: structure, not weights), the threads, the library versions and the CPU
  model: a second process, a warm start, or the same architecture with other weights builds
  only the winner and measures nothing;
* a family rule (a large transformer's float graph: OpenVINO first) builds the leader alone and
  stops there when it builds.

Given the graph before any rewrite, :func:`fastest` times PyTorch running it with the options,
and the winner must beat it by the margin or eager wins (:mod:`.beat_eager`); the decision is
cached with the others.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, cpu_name, library_versions
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact, onnx_artifact
from embedl_dynamo.precision import Precision
from embedl_dynamo.runtimes.base import ArtifactJudge, Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnx_artifact import OnnxArtifactRuntime
from embedl_dynamo.runtimes.reference import graph_outputs
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.beat_eager import EAGER, EagerSpeed, compiled_beats_eager
from embedl_dynamo.tuning.judge import judge_artifact
from embedl_dynamo.tuning.runtime_rules import architecture_key, family_rule
from embedl_dynamo.tuning.timer import fastest_of, time_options

__all__ = [
    "RunOption",
    "RuntimeChoice",
    "fastest",
    "measure_runtimes",
    "run_options",
]

logger = logging.getLogger(__name__)

_NAMESPACE = "runtime_choice"
_FORMAT = 2  # 2: keyed by architecture, not by artifact content


@dataclass(frozen=True)
class RunOption:
    """One way to run a subgraph: a runtime and the graph it runs (float, mixed...).

    Attributes:
        label: how reports name it (``openvino``, ``openvino mixed``).
        runtime: the runtime class.
        model: the graph it builds.
        lower_precision: a lower precision than float (``mixed``): it must beat float by more
            than noise (:func:`~embedl_dynamo.tuning.timer.fastest_of`).
    """

    label: str
    runtime: type[Runtime]
    model: fx.GraphModule
    lower_precision: bool = False


@dataclass
class RuntimeChoice:
    """The winning option, its built and active runtime, the medians per option label (ms;
    empty when the choice came from the cache or nothing was timed) and a note for the report;
    ``eager`` is set when PyTorch beat the runtimes (the option is eager's: the graph before
    any rewrite, which the caller runs as it is)."""

    option: RunOption
    runtime: Runtime
    timings: dict[str, float]
    note: str
    eager: EagerSpeed | None = None
    from_cache: bool = False  # the decision was read from the cache, not timed


def measure_runtimes(
    runtimes: dict[str, Runtime], inputs: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Median ms per call of each built runtime on ``inputs``
    (:func:`~embedl_dynamo.tuning.timer.time_options`)."""
    return time_options({name: partial(r.infer, *inputs) for name, r in runtimes.items()})


class _Builder:
    """Builds the options' runtimes from one run of each graph on the sample and one export of
    it, shared by every runtime that builds that graph."""

    def __init__(
        self,
        options: Sequence[RunOption],
        inputs: Sequence[torch.Tensor],
        settings: Settings,
        axes: DynamicAxes | None,
        judge: ArtifactJudge = judge_artifact,
    ) -> None:
        self.inputs, self.settings, self.axes, self.judge = inputs, settings, axes, judge
        self.options = options
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}
        self.exported: dict[int, OnnxArtifact] = {}

    def exported_of(self, model: fx.GraphModule) -> OnnxArtifact:
        """``model``'s ONNX artifact, exported once for every option that builds it."""
        if id(model) not in self.exported:
            in_memory = any(
                p.runtime.builds_from_memory()
                for p in self.options
                if p.model is model and issubclass(p.runtime, OnnxArtifactRuntime)
            )
            self.exported[id(model)] = onnx_artifact(
                model,
                list(self.inputs),
                self.settings,
                self.axes,
                reference=lambda: self.outputs_of(model),
                in_memory=in_memory,
            )
        return self.exported[id(model)]

    def outputs_of(self, model: fx.GraphModule) -> tuple[torch.Tensor, ...]:
        """``model``'s outputs on the sample, computed once."""
        if id(model) not in self.outputs:
            self.outputs[id(model)] = graph_outputs(model, self.inputs)
        return self.outputs[id(model)]

    def build(self, option: RunOption) -> Runtime:
        """``option``'s runtime, built (raises what the build raises)."""
        runtime = option.runtime(self.settings, self.axes)
        if isinstance(runtime, OnnxArtifactRuntime):
            runtime.use_artifact(self.exported_of(option.model))
        if id(option.model) in self.outputs:
            runtime.share_reference(option.model, self.inputs, self.outputs[id(option.model)])
        return runtime.build(option.model, self.inputs, self.judge)


def _load(
    cache: ArtifactCache | None, key: str, labels: set[str]
) -> tuple[str, EagerSpeed | None] | None:
    def read(document: dict[str, Any]) -> tuple[str, EagerSpeed | None]:
        label = document["option"]
        if document.get("format") != _FORMAT or label not in labels:
            raise ValueError(f"format {document.get('format')!r}, option {label!r}")
        return label, EagerSpeed.from_dict(document["eager"]) if label == EAGER else None

    return None if cache is None else cache.get_json(key, read, "runtime choice", "timing again")


def _store(
    cache: ArtifactCache | None,
    key: str,
    winner: str,
    timings: dict[str, float],
    eager: EagerSpeed | None,
) -> None:
    if cache is None:
        return
    document = {"format": _FORMAT, "option": winner, "ms": timings, "cpu": cpu_name()}
    if eager is not None:
        document["eager"] = eager.to_dict()
    try:
        cache.put(
            key, json.dumps(document, indent=1).encode(), ".json", meta={"kind": "runtime choice"}
        )
    except OSError as exc:
        logger.debug("runtime choice not cached: %s", exc)


def _cached_choice(
    options: Sequence[RunOption], builder: _Builder, cache: ArtifactCache | None, key: str
) -> RuntimeChoice | None:
    """The cached winner, built alone (None: nothing cached, or it no longer builds)."""
    by_label = {o.label: o for o in options}
    loaded = _load(cache, key, set(by_label)) if len(options) > 1 else None
    if loaded is None:
        return None
    cached, eager = loaded
    option = by_label[cached]
    try:
        runtime = builder.build(option)
    except Exception as exc:  # the others are timed; where none builds, the caller says so
        logger.info("cached runtime choice %s failed to build (%s); timing again", cached, exc)
        return None
    how = "cached decision for this architecture on this CPU; not timed"
    note = f"{eager.reason} ({how})" if eager is not None else f"auto: {cached} ({how})"
    return RuntimeChoice(option, runtime, {}, note, eager, from_cache=True)


def _by_rule(options: Sequence[RunOption], builder: _Builder) -> RuntimeChoice | str | None:
    """The family rule's leader, built alone (:func:`~.runtime_rules.family_rule`); the
    leader's label when it failed to build (the others are timed without it); None when no
    rule applies (a lower-precision option is always measured)."""
    if len(options) < 2 or any(o.lower_precision for o in options):
        return None
    rule = family_rule(options[0].model, builder.inputs, [o.runtime.name for o in options])
    if rule is None:
        return None
    leader = next(o for o in options if o.runtime.name == rule.leader)
    try:
        runtime = builder.build(leader)
    except Exception as exc:  # the others may still run it
        logger.info("%s cannot run this graph: %s", leader.label, exc)
        return leader.label
    note = f"auto: {leader.label} by the {rule.family} rule ({rule.evidence}; not timed)"
    logger.info("%s", note)
    return RuntimeChoice(leader, runtime, {}, note)


def _build_all(options: Sequence[RunOption], builder: _Builder) -> dict[str, Runtime]:
    """Every option that builds, by label; raises the last error when none does."""
    built: dict[str, Runtime] = {}
    error: Exception | None = None
    for option in options:
        try:
            built[option.label] = builder.build(option)
        except Exception as exc:  # the others may still run it
            logger.info("%s cannot run this graph: %s", option.label, exc)
            error = exc
    if not built:
        assert error is not None
        raise error
    return built


def fastest(
    options: Sequence[RunOption],
    inputs: Sequence[torch.Tensor],
    settings: Settings,
    axes: DynamicAxes | None = None,
    judge: ArtifactJudge = judge_artifact,
    eager: fx.GraphModule | None = None,
) -> RuntimeChoice:
    """The cached decision, else the family rule's leader, else every option built and the
    fastest kept (see the module docstring).

    Args:
        options: the ways to run the subgraph, best first (ties and failures favour the
            earlier); labels must differ.
        inputs: the example inputs (timed on).
        settings: the settings (cache directory, threads).
        axes: the dynamic axes of the artifacts.
        judge: the verdict on each artifact's outputs on the sample (see
            :func:`~embedl_dynamo.tuning.judge.judge_against`).
        eager: the graph before any rewrite: PyTorch running it is timed with the options
            (even one), and the winner must beat it (:mod:`.beat_eager`); None: not timed.

    Returns:
        The :class:`RuntimeChoice`.

    Raises:
        Exception: what the last option raised, when none of them builds.
    """
    builder = _Builder(options, inputs, settings, axes, judge)
    contest = [*options, RunOption(EAGER, EagerRuntime, eager)] if eager is not None else options
    architectures = {id(o.model): architecture_key(o.model, inputs, repr(axes)) for o in contest}
    key = content_key(
        _NAMESPACE,
        _FORMAT,
        [[o.label, o.runtime.name, architectures[id(o.model)]] for o in contest],
        settings.num_threads,
        library_versions(o.runtime for o in options),
        cpu_name(),
    )
    try:
        cache = ArtifactCache(settings.cache_dir, _NAMESPACE)
    except OSError:
        cache = None
    cached = _cached_choice(contest, builder, cache, key)
    if cached is not None:
        return cached
    ruled = _by_rule(options, builder)  # a rule's graph: eager is not timed
    if isinstance(ruled, RuntimeChoice):
        return ruled
    built = _build_all([o for o in options if o.label != ruled], builder)
    if eager is not None:
        built[EAGER] = builder.build(contest[-1])
    winner, timings, beaten = _timed_winner(contest, built, inputs)
    if timings:
        _store(cache, key, winner, timings, beaten)
    for label, runtime in built.items():
        if label != winner:
            runtime.deactivate()
    shown = ", ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(timings.items(), key=lambda t: t[1]))
    note = f"auto: {winner}, timed fastest here ({shown})" if timings else f"auto: {winner}"
    note = beaten.reason if beaten is not None else note
    logger.info("%s", note)
    option = next(o for o in contest if o.label == winner)
    return RuntimeChoice(option, built[winner], timings, note, beaten)


def _timed_winner(
    contest: Sequence[RunOption], built: dict[str, Runtime], inputs: Sequence[torch.Tensor]
) -> tuple[str, dict[str, float], EagerSpeed | None]:
    """The winner among the ``built`` options of the ``contest``, their medians (none when one
    was built) and, where eager won, the fastest runtime's and eager's medians: eager wins
    unless that runtime beats it by the margin (:func:`~.beat_eager.compiled_beats_eager`)."""
    if len(built) == 1:
        (winner,) = built
        return winner, {}, None
    timings = measure_runtimes(built, inputs)
    lower = {o.label for o in contest if o.lower_precision}
    winner = fastest_of({label: timings[label] for label in built if label != EAGER}, lower)
    if EAGER not in built:
        return winner, timings, None
    speed = EagerSpeed(winner, timings[winner], timings[EAGER])
    return (winner, timings, None) if compiled_beats_eager(speed) else (EAGER, timings, speed)


def run_options(
    model: fx.GraphModule,
    float_model: fx.GraphModule | None,
    runtime_cls: type[Runtime],
    timed: list[type[Runtime]],
    precision: Precision,
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
    if not precision.per_layer:
        return [RunOption(runtime_cls.name, runtime_cls, model)]
    mixed = RunOption(f"{runtime_cls.name} mixed", runtime_cls, model, lower_precision=True)
    others = [c for c in timed if c is not runtime_cls]
    return [mixed, *(RunOption(f"{c.name} fp32", c, float_model) for c in others)]
