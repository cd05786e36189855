"""How a lower-precision artifact (INT8, FP16, BF16, mixed) is judged against the float model.

``accuracy_budget`` is the least cosine similarity of the outputs to the float model's on
calibration data: the artifact runs on the build sample and up to two calibration batches of the
same shapes (the data ``mixed`` decided on), all outputs concatenated. Below the budget, or NaN,
the compile falls back to the float artifact with a warning; fake-quant never runs.

Speed is judged by :data:`LOWER_PRECISION_MARGIN`: a lower precision is chosen over float only
when it takes at most that fraction of float's time, so timing noise cannot pick it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from embedl_dynamo.errors import OutputMismatchError
from embedl_dynamo.runtimes.base import Runtime, output_cosine

__all__ = ["LOWER_PRECISION_MARGIN", "check_precision", "judging_sample"]

LOWER_PRECISION_MARGIN = 0.97  # at least 3% faster than float as a whole, or float runs


def judging_sample(inputs: list[torch.Tensor], data: Any) -> list[list[torch.Tensor]]:
    """What a lower precision is judged on: the build sample and up to two calibration batches
    of the same shapes (``accuracy_budget`` is a cosine on calibration data)."""
    sample = [list(inputs)]
    if not isinstance(data, (list, tuple)):
        return sample  # a forward_loop, or none: the build sample only
    for batch in list(data)[:2]:
        batch = list(batch) if isinstance(batch, (list, tuple)) else [batch]
        fits = len(batch) == len(inputs) and all(
            isinstance(b, torch.Tensor) and b.shape == t.shape and b.dtype == t.dtype
            for b, t in zip(batch, inputs)
        )
        if fits:
            sample.append(batch)
    return sample


def check_precision(
    runtime: Runtime,
    float_model: fx.GraphModule,
    sample: list[list[torch.Tensor]],
    budget: float,
) -> None:
    """Raise :class:`OutputMismatchError` unless the lower-precision artifact's outputs have
    cosine similarity >= ``budget`` to the float model's over ``sample`` (all outputs of all
    batches, concatenated)."""
    expected, actual = [], []
    for batch in sample:
        with torch.no_grad():
            out = float_model(*batch)
        expected.extend(out if isinstance(out, (tuple, list)) else (out,))
        actual.extend(runtime.infer(*batch))
    cosine = output_cosine(expected, actual)
    if not cosine >= budget:  # NaN fails too
        raise OutputMismatchError(
            f"cosine {cosine:.4f} to the float model < accuracy_budget {budget:g}"
        )
