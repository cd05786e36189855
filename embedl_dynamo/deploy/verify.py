"""Verification of an exported ONNX file: run it in ONNX Runtime and compare with PyTorch.

A float export is compared with the user's eager model; an INT8 export with the fake-quant
PyTorch graph the pipeline produced (the same arithmetic), and its distance to the float model
is reported too (cosine similarity), since INT8 is not meant to equal float. With a dynamic batch
the file is also run on a doubled batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embedl_dynamo.errors import ExportError, VerificationError, error_line
from embedl_dynamo.precision import Precision

__all__ = [
    "Verification",
    "cosine",
    "flat_outputs",
    "float_tolerance",
    "int8_tolerance",
    "max_diff",
    "run_onnx",
    "verify_onnx",
]


def float_tolerance(reference_absmax: float) -> float:
    """Max abs difference accepted for a float export: 1e-4 relative to the output scale.

    ONNX Runtime's kernels and BatchNorm folding reorder float32 sums (ResNet-50 here: 2e-5 to
    5e-5 on outputs of order one), so bit equality is not expected.
    """
    return 1e-4 * max(1.0, reference_absmax)


def half_tolerance(reference_absmax: float) -> float:
    """Max abs difference accepted between an FP16/BF16 file on ORT and the cast PyTorch graph.

    Both round to half precision, but ONNX Runtime's CPU provider computes ops without a half
    kernel in float32 between inserted casts, so roundings land differently; 2% of the output
    scale is a few half-precision steps of a deep network, and still catches a wrong type.
    """
    return 2e-2 * max(1.0, reference_absmax)


def int8_tolerance(reference_absmax: float) -> float:
    """Max abs difference accepted between the QDQ file on ORT and the fake-quant graph.

    Both compute the same quantized arithmetic, but a value that lands on a rounding tie can
    round to the neighbouring level in one of them, and the step propagates; 5% of the output
    scale admits a few such flips and still catches a wrong scale or a missing QDQ pair.
    """
    return 5e-2 * max(1.0, reference_absmax)


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_onnx` measured."""

    max_abs_diff: float
    tolerance: float
    compared_with: str
    batch_sizes: tuple[int, ...]
    cosine_to_float: float | None


def flat_outputs(out: Any) -> list[torch.Tensor]:
    """A model's output (tensor, or nested tuples/lists/dicts of tensors, such as an HF
    ``ModelOutput``) as a flat list, dicts in key order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat_outputs(item)]
    if isinstance(out, Mapping):
        return [t for item in out.values() for t in flat_outputs(item)]
    raise ExportError(f"the model returned a {type(out).__name__}; export needs tensor outputs")


def run_onnx(path: Path, args: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """The ONNX file's outputs on ``args``, run by ONNX Runtime on the CPU."""
    from embedl_dynamo.deploy.onnx_backend import EmbedlOnnxBackend

    rep = EmbedlOnnxBackend.prepare(str(path), device="CPU", log_severity_level=4)
    return list(rep.run([a.detach().cpu().numpy() for a in args]))


_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?")


def _run_failure(exc: Exception, batch: int) -> VerificationError:
    """One line naming the node ONNX Runtime failed in, the batch size, and the way out."""
    found = _ORT_NODE.search(" ".join(str(exc).split()))  # the node may be named on any line
    where = f"{found.group(1)} node '{found.group(2)}'" if found else "a node"
    detail = (found.group(3) or "") if found else error_line(exc, with_type=False)
    return VerificationError(
        f"the exported file fails at batch {batch} in {where}: {detail.strip()[:300]}. A size the "
        "model computes from its input (e.g. a class token's expand(x.shape[0], ...)) was "
        "captured as a constant; export with dynamic_batch=False (--static-batch) for a file "
        "of this batch size"
    )


def max_diff(got: Sequence[np.ndarray], want: Sequence[torch.Tensor]) -> tuple[float, float]:
    """(max abs difference, max abs of the reference) over all outputs."""
    if len(got) != len(want):
        raise VerificationError(f"the ONNX file has {len(got)} outputs, PyTorch gives {len(want)}")
    diff = absmax = 0.0
    for g, w in zip(got, want):
        w_np = w.detach().cpu().numpy()
        if g.shape != w_np.shape:
            raise VerificationError(
                f"output shape {tuple(g.shape)} from ONNX Runtime, {tuple(w_np.shape)} from PyTorch"
            )
        if w_np.size:
            diff = max(diff, float(np.max(np.abs(g.astype(np.float64) - w_np))))
            absmax = max(absmax, float(np.max(np.abs(w_np))))
    return diff, absmax


def cosine(a: Sequence[np.ndarray], b: Sequence[torch.Tensor]) -> float:
    """Cosine similarity of two output lists, flattened and concatenated."""
    x = np.concatenate([np.ravel(v).astype(np.float64) for v in a])
    y = np.concatenate([t.detach().cpu().numpy().ravel().astype(np.float64) for t in b])
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.dot(x, y) / denom) if denom else 1.0


def verify_onnx(
    path: Path,
    args: tuple[torch.Tensor, ...],
    reference: Callable[..., Any],
    float_model: nn.Module,
    precision: Precision,
    dynamic_batch: bool,
    tolerance: float | None,
) -> Verification:
    """Run the file in ORT on ``args`` (and on a doubled batch when dynamic) against PyTorch.

    ``reference`` is the eager model for ``fp32``, else the PyTorch graph at ``precision``
    (fake-quant for ``int8``/``mixed``, cast for ``fp16``/``bf16``); the cosine to
    ``float_model`` is measured for every precision but ``fp32``.
    """
    lowered = precision.lower
    batches = [args]
    if dynamic_batch and args[0].dim() > 0:
        batch = args[0].shape[0]
        batches.append(
            tuple(
                torch.cat([a, a.flip(0)]) if a.dim() > 0 and a.shape[0] == batch else a
                for a in args
            )
        )
    worst = absmax = 0.0
    cosine_to_float = None
    for inputs in batches:
        try:
            got = run_onnx(path, inputs)
        except Exception as exc:  # ORT raises Fail/InvalidArgument/RuntimeException per node
            raise _run_failure(exc, inputs[0].shape[0] if inputs[0].dim() else 1) from exc
        with torch.no_grad():
            want = flat_outputs(reference(*inputs))
        diff, scale = max_diff(got, want)
        worst, absmax = max(worst, diff), max(absmax, scale)
        if lowered and cosine_to_float is None:
            with torch.no_grad():
                cosine_to_float = cosine(got, flat_outputs(float_model(*inputs)))
    if tolerance is not None:
        limit = tolerance
    elif precision.quantizes:
        limit = int8_tolerance(absmax)
    else:
        limit = half_tolerance(absmax) if lowered else float_tolerance(absmax)
    compared_with = (
        "fake-quant PyTorch graph"
        if precision.quantizes
        else f"{precision.name} PyTorch graph"
        if lowered
        else "eager PyTorch model"
    )
    return Verification(
        max_abs_diff=worst,
        tolerance=limit,
        compared_with=compared_with,
        batch_sizes=tuple(b[0].shape[0] if b[0].dim() else 1 for b in batches),
        cosine_to_float=cosine_to_float,
    )
