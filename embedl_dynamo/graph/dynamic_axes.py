"""Which axes of a Dynamo graph's inputs and outputs are dynamic, with one name per size.

Dynamo marks an axis symbolic (a ``SymInt`` in the placeholder's fake tensor) once it has seen
it change, and recompiles once; every such axis must stay dynamic in the exported artifact, or
the next new size fails inside the runtime. On top of that, with ``dynamic_batch`` dim 0 of the
inputs that share the first input's batch size is dynamic from the first compile on, named
``batch`` (so the static first graph and the symbolic recompile key to the same artifact),
except once Dynamo has made the batch symbolic: a dim 0 it kept static beside it is not tied
to the batch, however equal their sizes are in the call that compiled.

Equal symbols get equal names, so ONNX Runtime and TensorRT know that two axes have one size;
an output axis that is an expression of sizes (``s0 - 2``) gets a name of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import is_concrete_int

__all__ = ["BATCH", "DynamicAxes", "batch_axes", "dynamic_axes"]

BATCH = "batch"


@dataclass(frozen=True)
class DynamicAxes:
    """Dynamic axes per input and per output: ``{axis: name}``, in graph order.

    ``static_graph``: Dynamo traced every input size as a constant, so its guards call this
    graph with exactly the sizes it was compiled for (a new size compiles another graph); a
    runtime may then build for those sizes alone, while the artifact keeps its dynamic axes
    for the graphs that share it. Not part of :meth:`to_json` (the artifact is the same).
    """

    inputs: tuple[Mapping[int, str], ...]
    outputs: tuple[Mapping[int, str], ...] = ()
    static_graph: bool = False

    @property
    def any(self) -> bool:
        return any(self.inputs) or any(self.outputs)

    def to_json(self) -> dict[str, Any]:
        """For content keys: lists of ``[axis, name]`` pairs."""
        return {
            "inputs": [sorted(a.items()) for a in self.inputs],
            "outputs": [sorted(a.items()) for a in self.outputs],
        }


def _fake(node: fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _symbolic(size: Any) -> bool:
    """Whether ``size`` can change: a ``SymInt`` that Dynamo did not specialise to a constant
    (``dynamic=True`` makes every size symbolic, and a ``view`` to a model's fixed head count
    guards it back to that number)."""
    return isinstance(size, torch.SymInt) and not is_concrete_int(size)


def _name(size: Any, names: dict[str, str]) -> str | None:
    """The axis name of a symbolic ``size`` (None when it is a plain or specialised int)."""
    if not _symbolic(size):
        return None
    text = str(size)
    if text not in names:
        names[text] = re.sub(r"\W+", "_", text).strip("_") or f"dim{len(names)}"
    return names[text]


def dynamic_axes(
    gm: fx.GraphModule,
    user_inputs: Sequence[int],
    example_inputs: Sequence[torch.Tensor],
    dynamic_batch: bool,
) -> DynamicAxes:
    """The dynamic axes of the Dynamo graph ``gm`` for the inputs it keeps after freezing.

    Args:
        gm: the graph Dynamo gave the backend (placeholders carry fake tensors).
        user_inputs: indices of the placeholders that stay inputs (``FrozenGraph.user_inputs``).
        example_inputs: the real tensors of those inputs, in order.
        dynamic_batch: also make dim 0 dynamic where it equals the first input's batch.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names: dict[str, str] = {}
    first = next((t for t in example_inputs if t.dim() > 0), None)
    if first is not None:
        index = next(i for i, t in enumerate(example_inputs) if t is first)  # not ==
        fake = _fake(placeholders[user_inputs[index]])
        size = fake.shape[0] if fake is not None and fake.dim() > 0 else None
        if _symbolic(size):
            names[str(size)] = BATCH
    inputs = []
    symbolic = False
    for index, tensor in zip(user_inputs, example_inputs):
        fake = _fake(placeholders[index])
        symbolic |= any(map(_symbolic, getattr(fake, "shape", ())))
        axes: dict[int, str] = {}
        shape = getattr(fake, "shape", ())  # an int input (a 0-d tensor) has none
        for axis, size in enumerate(shape):
            name = _name(size, names)
            if name is not None:
                axes[axis] = name
        heuristic_batch = (
            first is not None and tensor.dim() > 0 and tensor.shape[0] == first.shape[0]
        )
        # Dynamo gives equal symbolic sizes one symbol: a dim 0 it kept static beside a
        # symbolic batch is another axis that only happens to have the batch's size now
        if fake is not None and tensor is not first and BATCH in names.values():
            heuristic_batch = False
        if dynamic_batch and heuristic_batch and 0 not in axes:
            axes[0] = BATCH
        inputs.append(axes)
    outputs = []
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = output_node.args[0]
    values = returned if isinstance(returned, (tuple, list)) else (returned,)
    for position, value in enumerate(values):
        fake = _fake(value) if isinstance(value, fx.Node) else None
        axes = {}
        for axis, size in enumerate(fake.shape if isinstance(fake, torch.Tensor) else ()):
            if _symbolic(size):
                text = str(size)
                axes[axis] = names.get(text) or f"output{position}_dim{axis}"
            elif (
                axis == 0
                and dynamic_batch
                and first is not None
                and int(size) == first.shape[0]
                and BATCH in {a.get(0) for a in inputs}
            ):
                axes[0] = BATCH
        outputs.append(axes)
    return DynamicAxes(tuple(inputs), tuple(outputs), static_graph=not symbolic)


def batch_axes(
    example_inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    dynamic_batch: bool,
) -> DynamicAxes:
    """Dim 0 named ``batch`` wherever it equals the first input's batch (or nothing dynamic).

    For graphs without Dynamo's fake tensors (``export``, a plain GraphModule).
    """
    first = next((t for t in example_inputs if t.dim() > 0), None)
    if not dynamic_batch or first is None:
        return DynamicAxes(tuple({} for _ in example_inputs), tuple({} for _ in outputs))

    def axes(t: torch.Tensor) -> dict[int, str]:
        return {0: BATCH} if t.dim() > 0 and t.shape[0] == first.shape[0] else {}

    return DynamicAxes(tuple(axes(t) for t in example_inputs), tuple(axes(t) for t in outputs))
