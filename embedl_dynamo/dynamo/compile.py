"""Compile one Dynamo subgraph: freeze, run the pipeline, build a runtime, fall back.

Per subgraph Dynamo hands over:

1. a training graph or inputs that require grad run eagerly, with one warning;
2. subgraphs with fewer than ``min_subgraph_size`` ops stay in PyTorch;
3. :func:`~embedl_dynamo.graph.freeze.freeze`, :func:`~embedl_dynamo.pipeline.run_pipeline`,
   then the runtime is built through the artifact cache (:mod:`embedl_dynamo.runtimes`);
4. if export or the runtime fails, ``fallback="eager"`` runs the graph in PyTorch and the
   report says why; ``fallback="raise"`` raises.

With a warm cache a subgraph keyed before transformation loads its artifact without re-running
the pipeline; INT8 without calibration data calibrates on the first real calls.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.dynamo.subgraph_alias import store_alias
from embedl_dynamo.dynamo.warm_start import source_key, warm_start
from embedl_dynamo.errors import CalibrationDataError, error_line
from embedl_dynamo.graph.dynamic_axes import dynamic_axes
from embedl_dynamo.graph.freeze import freeze, inference_blocker
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.quant.calibrate import calibration_mismatch, fit_batches_to_graph
from embedl_dynamo.quant.lazy import calibrate_then_build
from embedl_dynamo.report.record import next_index, record
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.registry import runtime_candidates
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import check_precision, judging_sample
from embedl_dynamo.tuning.mixed_precision import apply_mixed
from embedl_dynamo.tuning.routing import cpu_precision_route, int8_route
from embedl_dynamo.tuning.runtime_choice import fastest, run_options

__all__ = ["compile_subgraph"]

logger = logging.getLogger(__name__)

_PREFIX = "embedl_"


def _count_ops(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)


def _as_output(gm: fx.GraphModule, outputs: tuple[torch.Tensor, ...]) -> Any:
    """Give runtime outputs the container type the Dynamo graph returns."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = out_node.args[0]
    if isinstance(returned, list):
        return list(outputs)
    if isinstance(returned, tuple):
        return outputs
    return outputs[0]


def compile_subgraph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend,
    settings: Settings,
) -> Callable[..., Any]:
    """Compile one Dynamo graph for ``backend``; the returned callable takes Dynamo's arguments.

    Args:
        gm: the graph Dynamo gave (parameters lifted as inputs); not modified.
        example_inputs: the real inputs Dynamo gave with it.
        backend: the target.
        settings: the settings.

    Returns:
        A callable taking the same arguments as ``gm``.
    """
    start = time.perf_counter()
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    # a forced, missing runtime raises
    candidates = runtime_candidates(settings.runtime, backend, on_cuda)
    runtime_cls, route = int8_route(candidates[0], settings.precision)
    report = SubgraphReport(
        index=next_index(), backend=backend.name, runtime="eager", ops=_count_ops(gm), status=""
    )
    backend, cpu_route = cpu_precision_route(runtime_cls, backend, settings)
    report.reason = route or cpu_route
    # with several CPU runtimes, float graphs (and mixed against float) are timed on each
    timed = [] if on_cuda else [c for c in candidates if c.cpu_target is not None]
    if len(timed) < 2:
        timed = []

    def _eager(status: str, reason: str, fn: Callable[..., Any] = gm.forward):
        report.status, report.reason = status, reason
        report.compile_s = time.perf_counter() - start
        record(report)
        logger.info("subgraph %d stays in PyTorch: %s", report.index, reason)
        return fn

    blocker = inference_blocker(gm, example_inputs)
    if blocker is not None:
        warnings.warn(
            f"embedl_{backend.name}: this graph runs eagerly, not frozen for inference: {blocker}",
            RuntimeWarning,
            stacklevel=2,
        )
        return _eager("training", blocker)
    if report.ops < settings.min_subgraph_size:
        return _eager(
            "eager",
            f"{report.ops} ops < min_subgraph_size={settings.min_subgraph_size}",
        )

    frozen = freeze(gm, example_inputs)
    user = frozen.user_inputs
    inputs = [example_inputs[i] for i in user]
    if any(not isinstance(t, torch.Tensor) for t in inputs):
        return _eager("eager", "the graph takes non-tensor inputs that are not batch sizes")
    axes = dynamic_axes(gm, user, inputs, settings.dynamic_batch)

    alias_key = None
    if not settings.precision.lower and runtime_cls.cpu_target is not None:
        alias_key = source_key(frozen.gm, inputs, axes, backend, settings)
        runtimes = timed or [runtime_cls]
        infer = warm_start(alias_key, frozen.gm, inputs, axes, backend, settings, report, runtimes)
        if infer is not None:
            report.status = "compiled"
            report.compile_s = time.perf_counter() - start
            record(report)
            logger.info("%s", report)
            return _wrap(gm, infer, user, report, settings, backend, example_inputs)

    if settings.precision.calibrates and settings.calibration_data is not None:
        mismatch = calibration_mismatch(settings.calibration_data, inputs)
        if mismatch:  # e.g. a subgraph after a graph break: it sees other tensors
            logger.warning(
                "subgraph %d: calibration_data does not fit its inputs (%s); it calibrates on "
                "its first %d calls instead", report.index, mismatch, settings.calibration_steps,
            )  # fmt: skip
            settings = dataclasses.replace(settings, calibration_data=None)
        else:
            fitted = fit_batches_to_graph(frozen.gm, settings.calibration_data, inputs)
            if fitted is None and not callable(settings.calibration_data):
                logger.warning(
                    "subgraph %d: calibration_data has fewer samples than one batch of %d this "
                    "graph was compiled for; it calibrates on its first %d calls instead",
                    report.index, int(inputs[0].shape[0]), settings.calibration_steps,
                )  # fmt: skip
            if fitted is not None or not callable(settings.calibration_data):
                settings = dataclasses.replace(settings, calibration_data=fitted)
    lazy = settings.precision.quantizes and not settings.precision.per_layer  # lazy INT8
    lazy_int8 = lazy and settings.calibration_data is None
    mixed = settings.precision.per_layer
    float_settings = settings.float_copy() if lazy_int8 or mixed else settings
    try:
        result = run_pipeline(frozen.gm, inputs, backend, float_settings)
        if mixed:
            result = apply_mixed(result, inputs, backend.quantizer, settings, axes, runtime_cls)
    except (NotImplementedError, CalibrationDataError):
        raise  # bad calibration data is the user's to fix: never a silent float fallback
    except Exception as exc:
        if settings.fallback == "raise":
            raise RuntimeError(f"embedl_{backend.name}: transformation failed: {exc}") from exc
        return _eager("eager", f"transformation failed: {error_line(exc)}")
    report.plan, report.pipeline = result.plan, result.report

    def _build(
        model: fx.GraphModule, float_model: fx.GraphModule | None = None
    ) -> Callable[..., Any] | None:
        """The runtime's infer, or None when it fails and the original graph runs instead.

        ``float_model`` marks ``model`` as lower precision (INT8, FP16, BF16): its artifact must
        agree with the float model within ``accuracy_budget``, or the float artifact runs
        instead (never fake-quant). An artifact ``mixed`` held to the budget on this runtime in
        this compile (the report's ``judged``) is not judged again.
        """
        judged = result.report.get("judged") if model is result.model else None
        options = run_options(model, float_model, runtime_cls, timed, settings.precision)
        runtime_label = "/".join(dict.fromkeys(o.runtime.name for o in options))
        try:
            if len(options) > 1:
                choice = fastest(options, inputs, settings, axes)
                runtime = choice.runtime
                report.reason = "; ".join(r for r in (report.reason, choice.note) if r)
                if choice.option.model is not model:  # the float graph beat the mixed one
                    _record_float_won(report, choice.note)
                    float_model = None
            else:
                runtime = options[0].runtime(settings, axes).build(model, inputs)
            if float_model is not None and not _judged_already(runtime, judged):
                sample = judging_sample(inputs, settings.calibration_data)
                check_precision(runtime, float_model, sample, settings.accuracy_budget)
        except Exception as exc:
            if float_model is not None and settings.fallback != "raise":
                logger.warning(
                    "subgraph %d: %s %s artifact rejected (%s); running the float artifact",
                    report.index, settings.precision, runtime_label, error_line(exc),
                )  # fmt: skip
                report.reason = f"{settings.precision} rejected, fp32 runs: {error_line(exc)}"
                return _build(float_model)
            if settings.fallback == "raise" or runtime_cls is EagerRuntime:
                raise RuntimeError(
                    f"embedl_{backend.name}: the {runtime_label} runtime cannot take this "
                    f"subgraph: {error_line(exc)}"
                ) from exc
            logger.warning(
                "subgraph %d: %s runtime failed (%s); running it in PyTorch",
                report.index,
                runtime_label,
                error_line(exc),
            )
            logger.debug("subgraph %d: runtime failure", report.index, exc_info=True)
            report.status, report.runtime = "eager", "eager"
            report.reason = f"{runtime_label} failed: {error_line(exc)}"
            return None  # the original Dynamo graph runs: no rewrite can break the fallback
        report.runtime = runtime.name
        report.cached = runtime.from_cache
        report.runtime_info = dict(runtime.build_info)
        return runtime.serve()

    if lazy_int8:
        infer = calibrate_then_build(
            result.model,
            inputs,
            backend.quantizer,
            settings,
            lambda quantized: _build(quantized, float_model=result.model),
        )
    elif result.model is not result.float_model:
        infer = _build(result.model, float_model=result.float_model)
    else:
        infer = _build(result.model)
    report.status = report.status or "compiled"
    report.compile_s = time.perf_counter() - start
    record(report)
    logger.info("%s", report)
    if alias_key is not None and report.status == "compiled" and report.runtime_info.get("key"):
        summary = {k: v for k, v in result.report.items() if isinstance(v, (int, float, str))}
        summary["applied_by_pattern"] = result.report.get("applied_by_pattern", {})
        alias = {"onnx_key": report.runtime_info["key"], "runtime": report.runtime}
        store_alias(alias_key, {**alias, "pipeline": summary}, settings)
    return _wrap(gm, infer, user, report, settings, backend, example_inputs)


def _judged_already(runtime: Runtime, judged: dict[str, str] | None) -> bool:
    """Whether ``runtime`` runs the very artifact ``mixed`` held to the budget on this runtime
    in this compile (:attr:`~embedl_dynamo.tuning.mixed_precision.MixedChoice.judged`)."""
    return (
        judged is not None
        and judged["runtime"] == runtime.name
        and judged["artifact"] == runtime.key()
    )


def _record_float_won(report: SubgraphReport, note: str) -> None:
    """The float graph on another runtime beat the mixed one: its layers run fp32."""
    report.pipeline = dict(report.pipeline, quantized=False)
    report.pipeline.pop("quantization", None)
    report.pipeline.pop("judged", None)
    report.pipeline["layers"] = [
        dict(r, precision="fp32", reason=f"the float graph ran faster ({note})")
        for r in report.pipeline.get("layers", [])
    ]


def _wrap(
    gm: fx.GraphModule,
    infer: Callable[..., Any] | None,
    user: list[int],
    report: SubgraphReport,
    settings: Settings,
    backend: Backend,
    example_inputs: Sequence[Any],
) -> Callable[..., Any]:
    """The callable Dynamo gets: picks the user inputs out of Dynamo's arguments.

    Without a runtime (``infer`` None) the original Dynamo graph runs. A call the runtime
    cannot take (a shape outside the artifact, a runtime error) runs the original graph too,
    with one warning per subgraph, unless ``fallback="raise"``: nothing escapes from inside a
    runtime.

    The weights were frozen into the artifact, so each call first checks that none of them
    changed since (``load_state_dict``, an optimizer step, ``weight.mul_(2)`` bump a tensor's
    version counter; a few integer reads per call) and recompiles the subgraph if one did.
    """
    if infer is None:
        return gm.forward
    warned = False
    frozen = _FrozenWeights(example_inputs, user)
    rebuilt: Callable[..., Any] | None = None  # the recompiled subgraph, once weights changed

    def compiled(*args: Any) -> Any:
        nonlocal warned, rebuilt
        if rebuilt is not None:
            return rebuilt(*args)
        changed = frozen.changed(args)
        if changed is not None:
            logger.info("subgraph %d: weight %s changed since compile; rebuilding",
                        report.index, changed)  # fmt: skip
            rebuilt = compile_subgraph(gm, args, backend, settings)
            return rebuilt(*args)
        try:
            outputs = infer(*[args[i] for i in user])
        except Exception as exc:
            if settings.fallback == "raise":
                raise
            if not warned:
                warned = True
                logger.warning(
                    "subgraph %d: the %s runtime failed on a call (%s); such calls run in "
                    "PyTorch", report.index, report.runtime, error_line(exc),
                )  # fmt: skip
                logger.debug("subgraph %d: call failure", report.index, exc_info=True)
                report.reason = f"some calls ran in PyTorch: {error_line(exc)}"
            return gm.forward(*args)
        return _as_output(gm, outputs)

    compiled.embedl_report = report  # type: ignore[attr-defined]
    return compiled


_VERSION = operator.attrgetter("_version")


class _FrozenWeights:
    """Identity and version counter of every frozen weight among Dynamo's arguments.

    Checked on every call, so with C-level ``map`` and tuple comparison rather than a Python
    loop (MobileNetV3's 266 weights: about 20 us a call instead of 130).
    """

    def __init__(self, args: Sequence[Any], user: list[int]) -> None:
        users = set(user)
        self.indices = [
            i for i, t in enumerate(args) if i not in users and isinstance(t, torch.Tensor)
        ]
        self.ids, self.versions = self._state(args)

    def _pick(self, args: Sequence[Any]) -> tuple[Any, ...]:
        if len(self.indices) > 1:
            return operator.itemgetter(*self.indices)(args)
        return tuple(args[i] for i in self.indices)

    def _state(self, args: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        tensors = self._pick(args)
        return tuple(map(id, tensors)), tuple(map(_VERSION, tensors))

    def changed(self, args: Sequence[Any]) -> str | None:
        """The first weight replaced or modified in place since compile, or None."""
        ids, versions = self._state(args)
        if ids == self.ids and versions == self.versions:
            return None
        for index, ident, version, old_id, old_version in zip(
            self.indices, ids, versions, self.ids, self.versions
        ):
            if ident != old_id or version != old_version:
                return f"argument {index}"
        return "a weight"
