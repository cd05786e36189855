"""Put back the graph inputs the TorchScript exporter drops because the graph does not read them.

A frozen graph may take an input only its number outputs use (a KV cache's position counter,
computed in PyTorch by :mod:`embedl_dynamo.graph.scalar_outputs`), or none of its outputs. The
exporter removes such an input from the ONNX graph, and the artifact would then take fewer
inputs than the caller passes. ONNX allows a graph input no node reads, so each dropped input is
declared again, in its place, with its dtype and shape (dynamic axes by name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["restore_dropped_inputs"]


def restore_dropped_inputs(
    model: Any,
    names: Sequence[str],
    args: Sequence[torch.Tensor],
    axes: Mapping[str, Mapping[int, str]],
) -> int:
    """Declare again, in place, each of ``names`` missing among ``model``'s graph inputs.

    Args:
        model: the exported ``onnx.ModelProto``; changed in place.
        names: the user inputs' names, in order (they lead the graph's inputs).
        args: the example inputs, one per name (dtype and shape).
        axes: dynamic axes by input name (``{name: {axis: dim_name}}``).

    Returns:
        How many inputs were put back.
    """
    from onnx import helper

    inputs = list(model.graph.input)
    present = {i.name for i in inputs}
    missing = [k for k, name in enumerate(names) if name not in present]
    if not missing:
        return 0
    for k in missing:
        dims = [axes.get(names[k], {}).get(d, size) for d, size in enumerate(args[k].shape)]
        elem = helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=args[k].dtype).numpy().dtype)
        inputs.insert(k, helper.make_tensor_value_info(names[k], elem, dims))
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return len(missing)
