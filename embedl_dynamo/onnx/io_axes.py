"""The ONNX graph's input and output names, and the dynamic axes an export gives them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from embedl_dynamo.graph.dynamic_axes import BATCH, DynamicAxes, batch_axes

__all__ = ["export_axes", "input_names", "output_names"]


def input_names(n: int) -> list[str]:
    """Names of the ONNX graph inputs: ``input_0``, ``input_1``..."""
    return [f"input_{i}" for i in range(n)]


def output_names(n: int) -> list[str]:
    """Names of the ONNX graph outputs: ``output_0``, ``output_1``..."""
    return [f"output_{i}" for i in range(n)]


def export_axes(
    args: tuple[torch.Tensor, ...],
    outputs: Sequence[torch.Tensor],
    dynamic_batch: bool,
    dynamic_axes: DynamicAxes | None,
) -> tuple[DynamicAxes, dict[str, dict[int, str]]]:
    """The dynamic axes of the export, and the same by input and output name (the
    TorchScript exporter's form); outputs follow the batch where only inputs' axes are given."""
    axes = dynamic_axes if dynamic_axes is not None else batch_axes(args, outputs, dynamic_batch)
    if len(axes.outputs) != len(outputs):  # inputs' axes only: outputs follow the batch
        batch = any(a.get(0) == BATCH for a in axes.inputs)
        axes = DynamicAxes(axes.inputs, batch_axes(args, outputs, batch).outputs)
    named = {
        **{n: dict(a) for n, a in zip(input_names(len(args)), axes.inputs) if a},
        **{n: dict(a) for n, a in zip(output_names(len(outputs)), axes.outputs) if a},
    }
    return axes, named
