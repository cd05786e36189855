"""Capture a model as one frozen torch-level graph with Dynamo (``fullgraph=True``).

``torch.fx.symbolic_trace`` cannot follow data-dependent Python control flow; Dynamo can, by
specialising on the example inputs. :func:`capture` compiles the model with a recording
backend, then freezes the lifted parameters and buffers (:mod:`embedl_dynamo.graph.freeze`), so the
result is a GraphModule whose placeholders are the user inputs and whose weights are constants
under their original paths. The export helper and :func:`embedl_dynamo.transform.trace` use it.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.errors import error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes, dynamic_axes
from embedl_dynamo.graph.freeze import FrozenGraph, freeze
from embedl_dynamo.graph.output_tree import OUTPUT_TREE_META, OutputTree

__all__ = ["DYNAMIC_AXES_META", "capture"]

logger = logging.getLogger(__name__)


DYNAMIC_AXES_META = "embedl_dynamic_axes"  # gm.meta: the declared capture's DynamicAxes


def capture(
    model: nn.Module,
    args: Sequence[Any],
    dynamic_batch: bool = False,
    dynamic_shapes: Sequence[Mapping[int, str] | None] | None = None,
) -> fx.GraphModule:
    """Trace ``model`` on ``args`` with Dynamo as a single graph and freeze its weights.

    Args:
        model: the model; it is run once on ``args`` (under ``torch.no_grad``), not modified.
        args: positional example inputs.
        dynamic_batch: capture dim 0 of the inputs that share the first input's batch as a
            symbolic size, so sizes computed from it (a class token's ``expand(x.shape[0],
            ...)``) stay symbolic instead of baking the example batch in (a batch-1 example is
            captured at batch 2: Dynamo specialises sizes of 1). A model that pins its batch
            is captured statically instead.

    Returns:
        A GraphModule taking the tensor inputs of ``args`` (in order) and returning what the
        Dynamo graph returns (a tuple); its ``meta[OUTPUT_TREE_META]`` is the model's output
        structure over those outputs (:class:`~embedl_dynamo.graph.output_tree.OutputTree`),
        or why it could not be recorded.

    Raises:
        RuntimeError: Dynamo cannot capture the model as one graph (a graph break); the message
            carries Dynamo's reason.
        ValueError: the inputs do not fit the model, or ``dynamic_shapes`` names an axis that
            cannot be dynamic (out of range, or of size 0 or 1 in the example).
    """
    if dynamic_shapes:
        return _capture_declared(model, args, dynamic_batch, dynamic_shapes)
    if dynamic_batch:
        first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
        if first is not None:
            batch = int(first.shape[0])
            marked = []
            for a in args:
                if isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch:
                    # Dynamo specialises a size of 1: a batch-1 example is captured on itself
                    # twice over (the graph is the same for every batch); mark_dynamic tags the
                    # tensor, so never the caller's
                    a = torch.cat([a, a]) if batch == 1 else a.clone()
                    torch._dynamo.mark_dynamic(a, 0)
                marked.append(a)
            gm = _capture_dynamic_batch(model, marked)
            if gm is not None:
                if batch == 1:  # the graph must take the example itself too
                    with torch.no_grad():
                        gm(*[a for a in args if isinstance(a, torch.Tensor)])
                return gm
    return _capture(model, args, dynamic=False)


def _capture_dynamic_batch(model: nn.Module, marked: list[Any]) -> fx.GraphModule | None:
    """The capture with a symbolic batch, or None where Dynamo cannot trace it so.

    A failed capture has run the model eagerly (to tell a bad input from a graph break), and
    a model that sets itself up on its first call (transformers installs its output hooks
    under a lock, a context manager Dynamo does not enter) traces on the second try."""
    for attempt in range(2):
        try:
            return _capture(model, marked, dynamic=None)
        except ValueError as exc:  # the model fails in eager on these inputs: no retry helps
            logger.debug("dynamic-batch capture failed (%s)", exc)
            break
        except RuntimeError as exc:
            logger.debug("dynamic-batch capture %d failed (%s)", attempt + 1, exc)
    logger.debug("capturing statically")
    return None


def _declared_axes(
    args: Sequence[Any], dynamic_shapes: Sequence[Mapping[int, str] | None]
) -> list[dict[int, str]]:
    """``dynamic_shapes`` checked against ``args``: ``{axis: name}`` per input."""
    if len(dynamic_shapes) != len(args):
        raise ValueError(
            f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(args)} inputs; give one "
            "per input (None for an input without dynamic axes)"
        )
    declared = []
    for index, (arg, axes) in enumerate(zip(args, dynamic_shapes, strict=True)):
        axes = dict(axes or {})
        rank = arg.dim() if isinstance(arg, torch.Tensor) else 0
        for axis, name in axes.items():
            if not isinstance(axis, int) or not -rank <= axis < rank or not isinstance(name, str):
                raise ValueError(
                    f"dynamic_shapes[{index}] = {axes!r}: give {{axis: name}} with an axis "
                    f"of input {index} (rank {rank}) and a string name"
                )
            if arg.shape[axis] < 2:
                raise ValueError(
                    f"input {index} axis {axis} has size {arg.shape[axis]} in the example: "
                    "Dynamo fixes sizes 0 and 1; give an example where it is at least 2"
                )
        declared.append({axis % rank if rank else axis: name for axis, name in axes.items()})
    return declared


def _capture_declared(
    model: nn.Module,
    args: Sequence[Any],
    dynamic_batch: bool,
    dynamic_shapes: Sequence[Mapping[int, str] | None],
) -> fx.GraphModule:
    """:func:`capture` with the declared axes (and the batch, when it is not 1) symbolic."""
    declared = _declared_axes(args, dynamic_shapes)
    first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
    batch = int(first.shape[0]) if dynamic_batch and first is not None else 1
    marked = []
    for arg, axes in zip(args, declared, strict=True):
        if isinstance(arg, torch.Tensor):
            arg = arg.clone()  # mark_dynamic tags the tensor: never the caller's
            for axis in sorted(axes) + ([0] if batch > 1 and arg.shape[:1] == (batch,) else []):
                torch._dynamo.mark_dynamic(arg, axis)
        marked.append(arg)
    try:
        gm = _capture(model, marked, dynamic=None, declared=declared)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{exc} (with the axes of dynamic_shapes symbolic: if the model's code fixes one of "
            "them, leave it out of dynamic_shapes)"
        ) from exc
    return gm


def _capture(
    model: nn.Module,
    args: Sequence[Any],
    dynamic: bool | None,
    declared: list[dict[int, str]] | None = None,
) -> fx.GraphModule:
    """One Dynamo capture of ``model(*args)``, frozen; see :func:`capture`. With ``declared``
    axes, the graph's dynamic axes are kept in its meta, the declared ones by their names."""
    captured: list[tuple[FrozenGraph, list[Any]]] = []
    refused: list[str] = []  # in-place ops that cannot be made functional, and why
    returned: list[Any] = []  # the graph's outputs on the call, for the output structure

    def _record(gm: fx.GraphModule, example_inputs: list[Any], **_: Any):
        # freeze now: Dynamo drops the placeholders' source metadata once compilation ends
        try:
            frozen = freeze(gm, example_inputs)
        except ValueError as exc:
            refused.append(str(exc))
            return gm.forward
        if declared is not None:
            user = [example_inputs[i] for i in frozen.user_inputs]
            axes = dynamic_axes(gm, frozen.user_inputs, user, dynamic_batch=False)
            named = tuple({**found, **mine} for found, mine in zip(axes.inputs, declared))
            frozen.gm.meta[DYNAMIC_AXES_META] = DynamicAxes(named, axes.outputs)
        captured.append((frozen, list(example_inputs)))

        def run(*inputs: Any) -> Any:
            out = gm.forward(*inputs)
            returned.append(out)
            return out

        return run

    compiled = torch.compile(_fresh_entry(model), backend=_record, fullgraph=True, dynamic=dynamic)
    try:
        # Dynamo's automatic dynamic keeps, per code name and place, what earlier calls saw:
        # every capture enters through the same code, so an earlier capture's sizes and float
        # attributes would make this one's symbolic. Only the axes marked dynamic are.
        with torch.no_grad(), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            result = compiled(*args)
    except Exception as exc:
        try:  # is it the inputs, not the capture? then say so, not "remove the graph break"
            with torch.no_grad():
                model(*args)
        except Exception as eager_exc:
            shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
            raise ValueError(
                f"{type(model).__name__} fails in PyTorch itself on inputs of shape {shapes}: "
                f"{error_line(eager_exc)}. Pass inputs of the shape the model takes"
            ) from eager_exc
        raise RuntimeError(
            f"Dynamo could not capture {type(model).__name__} as one graph: "
            f"{error_line(exc, with_type=False)}{_hint(exc)}"
        ) from exc
    if refused:
        raise RuntimeError(
            f"{type(model).__name__} cannot be captured without changing its results: "
            f"{refused[0]}; write that op out of place (y = y.op(...) instead of y.op_(...))"
        )
    if len(captured) != 1:
        raise RuntimeError(f"expected one Dynamo graph, got {len(captured)}")
    frozen, inputs = captured[0]
    user = [inputs[i] for i in frozen.user_inputs]
    if any(not isinstance(v, torch.Tensor) for v in user):
        raise RuntimeError("the captured graph takes non-tensor inputs; pass tensors only")
    _follow_argument_order(frozen.gm, user, args)
    frozen.gm.meta[OUTPUT_TREE_META] = _output_tree(result, returned, args)
    return frozen.gm


#: Dynamo's words where it leaves a recurrent layer out of its graph (``allow_rnn`` unset)
_RNN_REFUSED = "Attempted to wrap RNN, GRU, or LSTM"


def _hint(exc: Exception) -> str:
    """What to do about a graph break Dynamo's message alone does not say how to avoid."""
    if _RNN_REFUSED in str(exc):
        return (
            " (set torch._dynamo.config.allow_rnn = True first: by default Dynamo leaves "
            "nn.LSTM, nn.GRU and nn.RNN out of its graph)"
        )
    return ""


def _follow_argument_order(gm: fx.GraphModule, user: list[Any], args: Sequence[Any]) -> None:
    """Put ``gm``'s inputs in the order of the call's arguments.

    Dynamo numbers a graph's inputs in the order the code first reads them: ``forward(x, ids)``
    that embeds ``ids`` before it reads ``x`` takes ``ids`` first, and the file, its checks and
    ``load()`` take the arguments in the order the caller passes them. Each input is matched to
    its argument by identity (Dynamo traces the very tensors it was called with).
    """
    positions = [next((j for j, a in enumerate(args) if a is t), None) for t in user]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if None in positions or len(set(positions)) != len(positions):
        return  # an input that is no argument, or one passed twice: left as traced
    if positions == sorted(positions) or len(placeholders) != len(positions):
        return
    anchor = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for _, node in sorted(zip(positions, placeholders), key=lambda pair: pair[0]):
        anchor.prepend(node)
    gm.recompile()


def _output_tree(result: Any, returned: list[Any], args: Sequence[Any]) -> OutputTree | str:
    """The structure of the model's ``result`` over the graph's outputs on that call, or why
    it cannot be recorded."""
    outputs = returned[-1] if returned else ()
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    try:
        return OutputTree.of(result, outputs, args)
    except ValueError as exc:
        logger.debug("output structure not recorded: %s", exc)
        return str(exc)


def _fresh_entry(model: nn.Module) -> Callable[..., Any]:
    """``model(*args)`` behind a code object of its own.

    Dynamo keeps what it compiled per code object, and refuses a frame once that code was
    compiled ``recompile_limit`` times: compiling ``model`` itself shares ``nn.Linear.forward``
    with every other capture of a Linear in the process, so the ninth export failed. A fresh
    code object per capture starts with no cache entries, and frees them when it goes.
    """

    def entry(*args: Any) -> Any:
        return model(*args)

    return types.FunctionType(
        entry.__code__.replace(), entry.__globals__, entry.__name__, None, entry.__closure__
    )
