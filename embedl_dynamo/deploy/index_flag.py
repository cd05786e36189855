"""The index flag of an exported file: a named output, True where PyTorch would raise.

PyTorch raises for an index outside an op's range (a token id of -1, a position past the
table); ONNX Runtime wraps a negative one and OpenVINO reads zeros past the end, so the file
would answer such a call. An export of a graph with index ops
(:func:`~embedl_dynamo.graph.index_guards.guard_indices`) writes one more output, last, named
:data:`INDEX_FLAG_OUTPUT`: a bool, True when an index of the call is out of range. With a
dynamic batch axis it has that axis (every row holds the call's flag, so Triton and other
servers may keep the batch axis on every output); otherwise it is 0-d.

``load()`` reads it (:func:`check_index_flag`) and raises ``IndexError`` as PyTorch would. A
server that runs the file without ``load()`` (Triton) hands it to its clients, who must read
it: the export warns so, and :mod:`~embedl_dynamo.deploy.triton` writes it in the config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import TensorProto, helper

from embedl_dynamo.errors import ExportError
from embedl_dynamo.runtimes.reference import graph_call
from embedl_dynamo.tuning.judge import flat_outputs

__all__ = [
    "INDEX_FLAG_OUTPUT",
    "check_index_flag",
    "has_index_flag",
    "with_index_flag",
    "write_index_flag",
]

#: the name of the flag output in an exported file
INDEX_FLAG_OUTPUT = "embedl_index_out_of_range"
_BATCH = "batch"


def has_index_flag(output_names: Sequence[str]) -> bool:
    """Whether a file with these outputs ends with the index flag."""
    return bool(output_names) and output_names[-1] == INDEX_FLAG_OUTPUT


def _batch_input(model: onnx.ModelProto) -> int | None:
    """The position of the first graph input whose first axis is the dynamic batch axis."""
    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    for position, value in enumerate(inputs):
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].dim_param == _BATCH:
            return position
    return None


def write_index_flag(path: Path) -> int | None:
    """Name the last output of the ONNX file at ``path`` (the flag of
    :func:`~embedl_dynamo.graph.index_guards.guard_indices`, a 0-d bool) :data:`INDEX_FLAG_OUTPUT`,
    over the batch axis where the file has one; the file is rewritten in place, its weights
    (and their data file) untouched.

    Returns:
        The position of the input whose batch axis the flag takes (None: it stays 0-d).

    Raises:
        ExportError: the last output is not a bool (the graph lost its flag).
    """
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    flag = graph.output[-1]
    if flag.type.tensor_type.elem_type != TensorProto.BOOL:
        raise ExportError(
            f"{path.name}: the last output {flag.name!r} is not the index flag (a bool); "
            "report this, and export with the model's index ops guarded by hand meanwhile"
        )
    source, position = flag.name, _batch_input(model)
    if position is None:
        graph.node.append(helper.make_node("Identity", [source], [INDEX_FLAG_OUTPUT]))
        shape: list[str] = []
    else:
        weights = {t.name for t in graph.initializer}
        batch_input = [v for v in graph.input if v.name not in weights][position].name
        shape_name, zero, size = (f"{INDEX_FLAG_OUTPUT}_{s}" for s in ("shape", "zero", "size"))
        axis = helper.make_tensor(zero, TensorProto.INT64, [1], [0])
        graph.node.extend(
            [
                helper.make_node("Shape", [batch_input], [shape_name]),
                helper.make_node("Constant", [], [zero], value=axis),
                helper.make_node("Gather", [shape_name, zero], [size], axis=0),
                helper.make_node("Expand", [source, size], [INDEX_FLAG_OUTPUT]),
            ]
        )
        shape = [_BATCH]
    graph.output.remove(flag)
    graph.output.append(helper.make_tensor_value_info(INDEX_FLAG_OUTPUT, TensorProto.BOOL, shape))
    onnx.save(model, str(path))  # external tensors stay references: their bytes are not read
    return position


def with_index_flag(
    model: Callable[..., Any], computes_flag: bool, batch_input: int | None
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``model``'s flat outputs plus the flag as the file writes it, for comparing the two:
    the flag ``model`` computes (``computes_flag``, the pipeline's graph), else False (the
    user's model, which answers the inputs export is verified on); over the batch axis of
    input ``batch_input`` where :func:`write_index_flag` put one."""

    def run(*inputs: Any) -> tuple[torch.Tensor, ...]:
        outputs = flat_outputs(graph_call(model, inputs))
        flag = outputs.pop() if computes_flag else torch.zeros((), dtype=torch.bool)
        if batch_input is not None:
            flag = flag.reshape(1).expand(inputs[batch_input].shape[0])
        return (*outputs, flag)

    return run


def check_index_flag(name: str, flag: torch.Tensor, ops: Sequence[str]) -> None:
    """Raise ``IndexError``, as PyTorch does, when the file's ``flag`` output is set.

    Args:
        name: the file's name, for the message.
        flag: the flag output of a call.
        ops: the index ops the flag guards (the sidecar's), for the message.
    """
    if bool(flag.any()):
        where = f" in {', '.join(ops)}" if ops else ""
        raise IndexError(
            f"{name}: an index of this call is outside the range PyTorch takes{where} (a "
            "negative or too large id or position), where PyTorch raises IndexError; pass "
            "indices in range"
        )
