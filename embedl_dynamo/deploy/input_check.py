"""What a call to a loaded file must give, checked against its export sidecar before the runtime
runs: each input's dtype and static axes, named in one line with the fix, instead of the
runtime's own error (ONNX Runtime's ``INVALID_ARGUMENT : Unexpected input data type``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["check_inputs"]


def check_inputs(name: str, metadata: Mapping[str, Any], inputs: Sequence[torch.Tensor]) -> None:
    """Check ``inputs`` against the sidecar's ``inputs`` specs (``metadata``; nothing to check
    without them).

    Args:
        name: the file's name, for the message.
        metadata: the export sidecar.
        inputs: the call's tensors.

    Raises:
        TypeError: an input's dtype is not the one the file was exported with.
        ValueError: an axis the file holds static has another size.
    """
    specs = metadata.get("inputs")
    if not isinstance(specs, list) or len(specs) != len(inputs):
        return
    for i, (spec, t) in enumerate(zip(specs, inputs)):
        if not isinstance(spec, dict):
            continue
        want = spec.get("dtype")
        got = str(t.dtype).removeprefix("torch.")
        if isinstance(want, str) and want != got:
            raise TypeError(
                f"{name}: input {i} ({spec.get('name', i)}) is {got}, the file takes {want}; "
                f"pass it as .to(torch.{want})"
            )
        shape = spec.get("shape")
        if isinstance(shape, list) and len(shape) == t.dim():
            _check_static(name, i, shape, tuple(t.shape))


def _check_static(name: str, index: int, shape: list[Any], got: tuple[int, ...]) -> None:
    """Name the axis a call cannot change (a number in the sidecar's shape is static)."""
    for axis, (want, size) in enumerate(zip(shape, got)):
        if not isinstance(want, int) or want == size:
            continue
        fix = (
            "export with dynamic_batch=True (the default; --static-batch turns it off) to take "
            "any batch size"
            if axis == 0
            else f"export with dynamic_shapes (e.g. dynamic_shapes=[{{{axis}: 'seq'}}, ...]) to "
            "make it dynamic"
        )
        raise ValueError(
            f"{name}: input {index} axis {axis} is static ({want}) in this file, got {size}; {fix}"
        )
