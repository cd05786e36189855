"""The callable a compiled Dynamo subgraph becomes: user inputs to the runtime, outputs in
the graph's container type, a PyTorch fallback per call, a recompile once a frozen weight
changes."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.dynamo.frozen_weights import SAMPLED_BYTES, FrozenWeights
from embedl_dynamo.dynamo.input_overlap import overlapping_input
from embedl_dynamo.dynamo.write_back import planned_copies, write_back
from embedl_dynamo.errors import CallRefused, error_line
from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of
from embedl_dynamo.graph.output_views import OutputView
from embedl_dynamo.graph.scalar_outputs import ScalarOutputs
from embedl_dynamo.quant.int8.stage import QUANTIZATION_META
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.settings import Settings

__all__ = [
    "OUT_OF_RANGE",
    "WEIGHT_SETS",
    "calibrated_input_bounds",
    "in_place_writes",
    "watch_calibrated_ranges",
    "wrap_compiled",
]

logger = logging.getLogger(__name__)


def _as_output(gm: fx.GraphModule, outputs: tuple[Any, ...]) -> Any:
    """Give runtime outputs the container type the Dynamo graph returns."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = out_node.args[0]
    if isinstance(returned, list):
        return list(outputs)
    if isinstance(returned, tuple):
        return outputs
    return outputs[0]


def wrap_compiled(
    gm: fx.GraphModule,
    infer: Callable[..., Any] | None,
    user: list[int],
    report: SubgraphReport,
    settings: Settings,
    backend: Backend,
    example_inputs: Sequence[Any],
    recompile: Callable[[fx.GraphModule, Sequence[Any], Backend, Settings], Callable[..., Any]],
    scalars: ScalarOutputs | None = None,
    int_inputs: Sequence[int] = (),
    specialized: dict[int, float] | None = None,
    written: Sequence[int] = (),
    returned: dict[int, int] | None = None,
    views: dict[int, OutputView] | None = None,
    analysis: GraphAnalysis | None = None,
) -> Callable[..., Any]:
    """The callable Dynamo gets: picks the user inputs out of Dynamo's arguments.

    ``scalars`` computes the graph's number outputs (sizes) from the user inputs, in PyTorch,
    around the runtime's tensor outputs (:mod:`embedl_dynamo.graph.scalar_outputs`);
    the user inputs at ``int_inputs`` are Python ints the artifact takes as 0-d int64 tensors.
    Dynamo's arguments at ``specialized`` are floats the artifact holds as constants: a call
    with another value runs the original graph. The user inputs at ``written`` are written in
    place by the graph: the artifact returns their final values after its outputs, copied into
    the caller's tensors all or nothing (:mod:`~embedl_dynamo.dynamo.write_back`) unless the
    runtime wrote one there itself (:func:`in_place_writes`: a KV cache's scatter, so that a
    decode step copies no cache). The outputs at ``returned`` are a user input's tensor itself
    in eager: that input is returned there; those at ``views`` are views of another output or
    of an input, regenerated as such after the run. A call in which a written input overlaps
    another input runs the original graph, with one warning (:func:`_overlap_guard`).
    ``analysis`` is ``gm``'s (:mod:`embedl_dynamo.graph.analysis`), where the caller has it.

    Without a runtime (``infer`` None) the original Dynamo graph runs. A call the runtime
    cannot take (a shape outside the artifact, a runtime error, a guard's refusal) runs it
    too, with one warning per subgraph (unless ``fallback="raise"``, guards excepted). Each
    call first checks the frozen weights (:class:`~.frozen_weights.FrozenWeights`): other
    weights run a build for them (``recompile``; several kept, :func:`_by_weights`).
    """
    if infer is None:
        return gm.forward
    if written and hasattr(infer, "writing_in_place"):  # Served, maybe behind guards
        infer = infer.writing_in_place(in_place_writes(gm, user, written, analysis))
    warned = False
    not_weights = [*user, *(specialized or {})]  # the rest of Dynamo's: weights

    def run(*args: Any) -> Any:
        nonlocal warned
        inputs = [args[i] for i in user]
        for k in int_inputs:
            inputs[k] = torch.tensor(int(inputs[k]))
        try:
            outputs, copies = _outputs(infer(*inputs), inputs, scalars, written, returned, views)
        except Exception as exc:  # no input written yet: PyTorch runs the call on them
            if settings.fallback == "raise" and not isinstance(exc, CallRefused):
                raise
            if not warned:
                warned = True
                _warn_call_failed(report, exc)
            return gm.forward(*args)
        write_back(copies)  # checked: one that fails now raises, never running the graph again
        return _as_output(gm, outputs)

    by_weights = _by_weights(
        run,
        FrozenWeights(example_inputs, not_weights),
        report.index,
        lambda args: recompile(gm, args, backend, settings),
    )
    overlap = _overlap_guard(user, written, report.index)

    def compiled(*args: Any) -> Any:
        if specialized and any(float(args[i]) != v for i, v in specialized.items()):
            return gm.forward(*args)  # a float the artifact holds as a constant changed
        if written and overlap(args):
            return gm.forward(*args)  # a written input shares memory with another input
        return by_weights(*args)

    compiled.embedl_report = report  # type: ignore[attr-defined]
    return compiled


def _warn_call_failed(report: SubgraphReport, exc: Exception) -> None:
    """Once a subgraph: the runtime failed on a call, which ran in PyTorch."""
    logger.warning(
        "subgraph %d: the %s runtime failed on a call (%s); such calls run in PyTorch",
        report.index,
        report.runtime,
        error_line(exc),
    )
    logger.debug("subgraph %d: call failure", report.index, exc_info=True)
    report.reason = f"some calls ran in PyTorch: {error_line(exc)}"


def _overlap_guard(
    user: Sequence[int], written: Sequence[int], index: int
) -> Callable[[Sequence[Any]], bool]:
    """Whether a call's written input overlaps another input in memory
    (:func:`~embedl_dynamo.dynamo.input_overlap.overlapping_input`): the artifact, made
    functional on inputs that did not, would miss eager's write showing in the other. Warns
    once for this subgraph."""
    warned = False

    def overlaps(args: Sequence[Any]) -> bool:
        nonlocal warned
        position = overlapping_input([args[i] for i in user], written)
        if position is None:
            return False
        if not warned:
            warned = True
            warnings.warn(
                f"subgraph {index}: input {position} is written in place and shares memory "
                "with another input on this call (views of one tensor); such calls run in "
                "PyTorch, which sees the write through both",
                RuntimeWarning,
                stacklevel=4,
            )
        return True

    return overlaps


def _by_weights(
    run: Callable[..., Any],
    frozen: FrozenWeights,
    index: int,
    rebuild: Callable[[Sequence[Any]], Callable[..., Any]],
) -> Callable[..., Any]:
    """A call that runs the build of the weights it is given: ``run`` for ``frozen``, else one
    made by ``rebuild``.

    Dynamo hands one graph the weights of every instance of an architecture (its guards check
    the weights' sizes, not which tensors they are), so the builds for up to
    :data:`WEIGHT_SETS` sets of live weights are kept, the latest used first: two models
    called in turn each keep their own build instead of rebuilding on every switch. A build
    whose weights were modified in place or freed can never match again and is released.
    """
    builds = [(frozen, run)]  # latest used first

    def by_weights(*args: Any) -> Any:
        for position, (weights, build) in enumerate(builds):
            if weights.changed(args) is None:
                if position:
                    builds.insert(0, builds.pop(position))
                return build(*args)
        weights = FrozenWeights(args, frozen.user)
        what = builds[0][0].changed(args)
        logger.info(
            "subgraph %d: weight %s is not the one compiled; building for these weights",
            index,
            what,
        )
        if what == SAMPLED_BYTES:
            _warn_data_write(index)
        build = rebuild(args)
        builds[:] = [b for b in builds if b[0].may_match_again(weights)][: WEIGHT_SETS - 1]
        builds.insert(0, (weights, build))
        return build(*args)  # this call's own build, whatever other threads put first

    return by_weights


_warned_data_write = False


def _warn_data_write(index: int) -> None:
    """Once a process: a weight changed through ``.data``, seen only by the sampled bytes."""
    global _warned_data_write
    if _warned_data_write:
        return
    _warned_data_write = True
    warnings.warn(
        f"subgraph {index}: a weight was written through .data (its version counter did not "
        "move); embedl_dynamo rebuilds because a sample of each weight's bytes changed, but a "
        ".data write that changes none of the sampled bytes is not seen. Update weights with "
        "p.copy_(new) under torch.no_grad() or load_state_dict() to be seen exactly",
        RuntimeWarning,
        stacklevel=3,
    )


def _outputs(
    outputs: Sequence[Any],
    inputs: Sequence[Any],
    scalars: ScalarOutputs | None,
    written: Sequence[int],
    returned: dict[int, int] | None,
    views: dict[int, OutputView] | None,
) -> tuple[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The graph's outputs from the runtime's (numbers merged in, the inputs the graph returns
    as themselves put back, views regenerated), and the copies of the written inputs' new
    values into the caller's tensors, each checked and none made yet
    (:mod:`~embedl_dynamo.dynamo.write_back`: all or nothing)."""
    if scalars is not None:
        outputs = scalars.merge(outputs, inputs)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    if written:
        outputs, copies = planned_copies(outputs, [inputs[k] for k in written])
    if returned:
        outputs = [inputs[returned[i]] if i in returned else o for i, o in enumerate(outputs)]
    if views:
        outputs = _regenerate_views(outputs, inputs, views)
    return tuple(outputs), copies


def _regenerate_views(
    outputs: Sequence[Any], inputs: Sequence[Any], views: dict[int, OutputView]
) -> tuple[Any, ...]:
    """The outputs with each of ``views`` replaced by its view of the output or input it
    views in eager, so that they share memory as eager's do."""
    regenerated = list(outputs)
    for position, view in views.items():
        regenerated[position] = view(inputs[view.index] if view.of_input else outputs[view.index])
    return tuple(regenerated)


# in-place ops whose functional form (a scatter) reads the old value only where it writes,
# so a runtime may compute it in the input's own memory
_SCATTER_WRITES = frozenset({"index_copy_", "index_put_"})
# reads of a tensor that look at its shape, never at its values
_SHAPE_READS = frozenset({"size", "dim", "stride", "sym_size", "sym_stride", "sym_numel"})


def _op_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def in_place_writes(
    gm: fx.GraphModule,
    user: Sequence[int],
    written: Sequence[int],
    analysis: GraphAnalysis | None = None,
) -> dict[int, int]:
    """The written inputs a runtime may update in their own memory, by position among the
    user inputs, each with its output's position counted from the end (the written values
    come last, in ``written``'s order).

    An input qualifies when its first in-place op in ``gm`` (Dynamo's graph) is a scatter
    (``index_copy_``, ``index_put_``) and nothing before that op reads its values (only its
    shape): the exported graph then reads the old input only in that scatter, and a runtime
    whose scatter kernel skips the input-to-output copy when both are one buffer (ONNX
    Runtime's CPU ScatterElements/ScatterND) computes the new value where it stands. A
    counter's ``add_(1)`` read before its write (the cache position) does not qualify.
    ``analysis`` is ``gm``'s (:mod:`embedl_dynamo.graph.analysis`), where the caller has it.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    analysis = analysis_of(gm, analysis)
    order, writers = analysis.order, analysis.written_inputs
    found = {}
    for j, k in enumerate(written):
        source = placeholders[user[k]]
        ops = sorted((op for op, p in writers.items() if p is source), key=order.__getitem__)
        if not ops or _op_name(ops[0]) not in _SCATTER_WRITES:
            continue
        first = order[ops[0]]
        earlier = (u for u in source.users if order[u] < first)
        if all(_op_name(u) in _SHAPE_READS for u in earlier):
            found[k] = j - len(written)
    return found


#: builds for this many sets of live weights are kept per compiled graph (see wrap_compiled)
WEIGHT_SETS = 4
#: an input this many times larger than the largest value calibration saw is clipped by INT8
OUT_OF_RANGE = 10.0
#: the range watch inspects every one of the first calls, then one call in this many
WATCH_EVERY_CALL, WATCH_STRIDE = 16, 8
_NUMPY_FLOATS = (torch.float32, torch.float64)  # read through numpy on the CPU


def calibrated_input_bounds(quantized: fx.GraphModule) -> dict[int, float]:
    """The largest magnitude calibration saw at each graph input it quantizes, by position."""
    ranges = quantized.meta.get(QUANTIZATION_META, {}).get("ranges", {})
    placeholders = [n.name for n in quantized.graph.nodes if n.op == "placeholder"]
    bounds = {}
    for position, name in enumerate(placeholders):
        seen = ranges.get(name)
        if isinstance(seen, dict) and "min" in seen and "max" in seen:
            bounds[position] = max(abs(float(seen["min"])), abs(float(seen["max"])))
    return bounds


def _peak(tensor: torch.Tensor) -> float:
    """The largest absolute value of ``tensor``; on the CPU through numpy, on one thread:
    torch's own reduction wakes its thread pool, whose spinning threads then compete with the
    runtime's for the cores during the inference that follows."""
    if not tensor.numel():
        return 0.0
    if tensor.device.type == "cpu" and tensor.dtype in _NUMPY_FLOATS:
        values = tensor.detach().numpy()
        return float(max(values.max(), -values.min()))
    return float(tensor.detach().abs().max())


def watch_calibrated_ranges(
    infer: Callable[..., Any], bounds: dict[int, float], index: int
) -> Callable[..., Any]:
    """``infer`` that warns once when an input reaches :data:`OUT_OF_RANGE` times the largest
    value calibration saw there: INT8 clips it, so the answer is wrong in a way no first-call
    check could see. The first :data:`WATCH_EVERY_CALL` calls are inspected, then every
    :data:`WATCH_STRIDE`-th (inputs that drift from the calibration data keep drifting: a
    sample finds them, without reading every input twice on every call, 3% of an 8-image
    MobileNetV3's call). After the warning, calls are not inspected again."""
    warned, calls = False, 0

    def watched(*inputs: Any) -> Any:
        nonlocal warned, calls
        calls += 1
        if not warned and (calls <= WATCH_EVERY_CALL or calls % WATCH_STRIDE == 0):
            for position, bound in bounds.items():
                tensor = inputs[position]
                peak = _peak(tensor)
                if OUT_OF_RANGE * max(bound, 1e-12) < peak < float("inf"):  # inf: refused
                    warned = True
                    warnings.warn(
                        f"subgraph {index}: input {position} reaches {peak:.3g}, "
                        f"{peak / max(bound, 1e-12):.0f}x the largest value calibration saw "
                        f"there ({bound:.3g}); INT8 clips it. Calibrate on data like the "
                        "inputs (calibration_data) or use precision='fp32'",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    break
        return infer(*inputs)

    return watched
