"""Write a compiled call's in-place results into the caller's tensors, all or nothing.

A graph that writes inputs in place (``a.add_(1)``) is made functional before export: the
artifact returns each written input's final value, and the compiled call copies it into the
caller's tensor (:func:`~embedl_dynamo.dynamo.compiled_call.wrap_compiled`). A call the runtime
cannot take runs the graph in PyTorch instead, which writes the inputs itself; so no copy may be
made before every copy is known to succeed, or the rerun would write an input twice
(``a.add_(1)`` applied two times). :func:`planned_copies` checks every copy first and raises
before the first is made (the call then runs in PyTorch on untouched inputs, and PyTorch's own
error, if any, follows); :func:`write_back` makes them once nothing else can fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["copy_problem", "planned_copies", "same_memory", "write_back"]


def same_memory(target: torch.Tensor, value: Any) -> bool:
    """Whether ``value`` is ``target``'s own memory, element for element (the runtime wrote
    it there itself)."""
    if value is target:
        return True
    return (
        isinstance(value, torch.Tensor)
        and value.data_ptr() == target.data_ptr()
        and value.device == target.device
        and value.dtype == target.dtype
        and value.shape == target.shape
        and value.stride() == target.stride()
    )


def copy_problem(target: torch.Tensor, value: Any) -> str | None:
    """Why ``target.copy_(value)`` would fail (None: it can be made).

    The cases where ``copy_`` raises: a value that is not a tensor or whose shape does not
    broadcast to the target's, a target with elements that share one memory location (an
    expanded tensor: PyTorch refuses to write it before writing anything) and an inference
    tensor outside ``torch.inference_mode()`` (PyTorch writes it, then raises).
    """
    if not isinstance(value, torch.Tensor):
        return f"the runtime gave {type(value).__name__}, not a tensor"
    if value.shape != target.shape:
        try:
            fits = torch.broadcast_shapes(value.shape, target.shape) == target.shape
        except RuntimeError:
            fits = False
        if not fits:
            return f"the runtime gave shape {tuple(value.shape)} for shape {tuple(target.shape)}"
    if any(stride == 0 and size > 1 for size, stride in zip(target.shape, target.stride())):
        return "several of its elements share one memory location (an expanded tensor)"
    if target.is_inference() and not torch.is_inference_mode_enabled():
        return "it is an inference tensor, written outside torch.inference_mode()"
    return None


def planned_copies(
    outputs: Sequence[Any], targets: Sequence[torch.Tensor]
) -> tuple[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The outputs before the last ``len(targets)`` (the written values), and the copies of
    those values into ``targets`` still to make (none for a value the runtime wrote in the
    target's own memory).

    Raises:
        ValueError: a copy cannot be made (:func:`copy_problem`); raised before any is made.
    """
    count = len(outputs) - len(targets)
    copies = []
    for position, (target, value) in enumerate(zip(targets, outputs[count:])):
        if same_memory(target, value):
            continue
        problem = copy_problem(target, value)
        if problem is not None:
            raise ValueError(
                f"written input {position} cannot take its new value ({problem}); no input was "
                "written, and the call runs in PyTorch"
            )
        copies.append((target, value))
    return tuple(outputs[:count]), copies


def write_back(copies: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Make the copies :func:`planned_copies` checked, outside autograd."""
    if not copies:
        return
    with torch.no_grad():
        for target, value in copies:
            target.copy_(value)
