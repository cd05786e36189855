"""Verification of an exported ONNX file: run it in ONNX Runtime and judge it as ``torch.compile``
judges an artifact (:mod:`embedl_dynamo.tuning.judge`, the one verdict).

A float export must match the user's eager model within
:data:`~embedl_dynamo.tuning.judge.FLOAT_RTOL` of each output's scale. A lower-precision
export (INT8, FP16, BF16, mixed) must be finite and reach ``accuracy_budget`` (cosine to the
float model) on every batch; its max abs difference to the PyTorch graph at that precision
(fake-quant for INT8) is measured and reported, not judged. With a dynamic batch the file is
also run on a doubled batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedl_dynamo.errors import ExportError, OutputMismatchError, VerificationError, error_line
from embedl_dynamo.precision import Precision
from embedl_dynamo.runtimes.onnxruntime.opsets import holds_bfloat16
from embedl_dynamo.tuning.judge import (
    FLOAT_RTOL,
    check_float,
    check_precision_outputs,
    cosine,
    sample_outputs,
)

__all__ = [
    "Verification",
    "max_diff",
    "run_onnx",
    "verify_onnx",
]


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_onnx` measured."""

    max_abs_diff: float  # to ``compared_with``, over every batch
    tolerance: float | None  # the float bound at the largest output's scale; None: lowered
    compared_with: str
    batch_sizes: tuple[int, ...]
    cosine_to_float: float | None  # the worst batch's; None for fp32
    failure: str | None = None  # the judge's reason for rejecting the file; None: it passes

    @property
    def passed(self) -> bool:
        """Whether the judge accepts the file."""
        return self.failure is None


def run_onnx(path: Path, args: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """The ONNX file's outputs on ``args``, run by ONNX Runtime on the CPU."""
    from embedl_dynamo.runtimes.onnxruntime.onnx_backend import EmbedlOnnxBackend

    rep = EmbedlOnnxBackend.prepare(str(path), device="CPU", log_severity_level=4)
    return list(rep.run([a.detach().cpu().numpy() for a in args]))


_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?")
# ONNX Runtime refusing a type its CPU kernels lack (bf16 Conv), or finding no kernel at all
_ORT_TYPE = re.compile(
    r"Type '(tensor\(\w+\))' of input parameter \([^)]*\) of operator \((\w+)\)"
    r"|Could not find an implementation for (\w+)\(\d+\) node"
)


def _elsewhere(target: str) -> str:
    """Where a file ONNX Runtime's CPU provider cannot run does run: not the target given."""
    if target == "openvino":
        return "OpenVINO, which runs this target's files (load() picks it)"
    if target == "tensorrt":
        return "TensorRT, this target's runtime, or for OpenVINO (backend='openvino')"
    return "a runtime that has one (OpenVINO: backend='openvino', or TensorRT for bf16)"


def _run_failure(
    exc: Exception, batch: int, path: Path | None = None, target: str = ""
) -> VerificationError:
    """One line naming the node ONNX Runtime failed in, the batch size, and the way out (for
    a missing kernel, a runtime that has it: the ``target``'s own where it has one)."""
    text = " ".join(str(exc).split())
    kernel = _ORT_TYPE.search(text)
    if kernel is not None:
        op = kernel.group(2) or kernel.group(3)
        types = f" for {kernel.group(1)}" if kernel.group(1) else ""
        if not types and path is not None and _holds_bfloat16(path):
            types = " for tensor(bfloat16)"  # ORT names no type for MatMul's missing kernel
        return VerificationError(
            f"ONNX Runtime's CPU provider, which verifies exports, has no {op} kernel{types}: "
            "export with verify=False (--no-verify) to write the file unchecked for "
            f"{_elsewhere(target)}, or choose fp16, fp32 or int8"
        )
    found = _ORT_NODE.search(text)  # the node may be named on any line
    where = f"{found.group(1)} node '{found.group(2)}'" if found else "a node"
    detail = (found.group(3) or "") if found else error_line(exc, with_type=False)
    return VerificationError(
        f"the exported file fails at batch {batch} in {where}: {detail.strip()[:300]}. A size the "
        "model computes from its input (e.g. a class token's expand(x.shape[0], ...)) was "
        "captured as a constant; export with dynamic_batch=False (--static-batch) for a file "
        "of this batch size"
    )


def _holds_bfloat16(path: Path) -> bool:
    import onnx

    try:
        return holds_bfloat16(onnx.load(str(path), load_external_data=False))
    except Exception:  # an unreadable file: the message names no type
        return False


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


def _batches(
    args: tuple[torch.Tensor, ...], dynamic_batch: bool, extra: Sequence[Sequence[torch.Tensor]]
) -> list[tuple[torch.Tensor, ...]]:
    """``args``, the ``extra`` batches, and with a dynamic batch ``args`` doubled."""
    batches = [args, *(tuple(b) for b in extra)]
    if dynamic_batch and args[0].dim() > 0:
        batch = args[0].shape[0]
        batches.append(
            tuple(
                torch.cat([a, a.flip(0)]) if a.dim() > 0 and a.shape[0] == batch else a
                for a in args
            )
        )
    return batches


def _outputs(model: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``model``'s flat outputs on ``inputs`` (no grad)."""
    try:
        return sample_outputs(model, [inputs])[0]
    except TypeError as exc:
        raise ExportError(f"{exc}; export needs tensor outputs") from exc


def _run(path: Path, inputs: Sequence[torch.Tensor], target: str) -> list[torch.Tensor]:
    """The file's outputs on ``inputs`` as tensors; a failure names the node and the batch."""
    try:
        got = run_onnx(path, inputs)
    except Exception as exc:  # ORT raises Fail/InvalidArgument/RuntimeException per node
        batch = inputs[0].shape[0] if inputs[0].dim() else 1
        raise _run_failure(exc, batch, path, target) from exc
    return [torch.from_numpy(np.array(g)) for g in got]


def verify_onnx(
    path: Path,
    args: tuple[torch.Tensor, ...],
    reference: Callable[..., Any],
    float_model: Callable[..., Any],
    precision: Precision,
    dynamic_batch: bool,
    tolerance: float | None,
    accuracy_budget: float,
    extra: Sequence[Sequence[torch.Tensor]] = (),
    target: str = "",
) -> Verification:
    """Run the file in ORT on ``args`` and ``extra`` (and on a doubled batch when dynamic) and
    judge it as ``torch.compile`` judges an artifact.

    ``reference`` is the eager model for ``fp32``, else the PyTorch graph at ``precision``
    (fake-quant for ``int8``/``mixed``, cast for ``fp16``/``bf16``): the max abs difference
    to it is reported. ``fp32`` is judged by :func:`~embedl_dynamo.tuning.judge.check_float`
    against it (``tolerance``: the bound relative to the output scale, default
    :data:`~embedl_dynamo.tuning.judge.FLOAT_RTOL`); every other precision by
    :func:`~embedl_dynamo.tuning.judge.check_precision_outputs` against ``float_model``.
    ``target`` (the export's target name) decides the advice when ONNX Runtime cannot run it.
    """
    lowered = precision.lower
    rtol = FLOAT_RTOL if tolerance is None else tolerance
    batches = _batches(args, dynamic_batch, extra if lowered else ())
    worst = absmax = 0.0
    failure = None
    expected, actual = [], []
    for inputs in batches:
        got = _run(path, inputs, target)
        want = _outputs(reference, inputs)
        diff, scale = max_diff([g.numpy() for g in got], want)
        worst, absmax = max(worst, diff), max(absmax, scale)
        if lowered:
            expected.append(_outputs(float_model, inputs))
            actual.append(got)
        elif failure is None:
            failure = _failure(check_float, want, got, "the exported file", rtol)
    cosine_to_float = None
    if lowered:
        cosine_to_float = min(cosine(e, a) for e, a in zip(expected, actual))
        failure = _failure(
            check_precision_outputs, expected, actual, accuracy_budget, "the exported file"
        )
    compared_with = (
        "fake-quant PyTorch graph"
        if precision.quantizes
        else f"{precision.name} PyTorch graph"
        if lowered
        else "eager PyTorch model"
    )
    return Verification(
        max_abs_diff=worst,
        tolerance=None if lowered else rtol * max(1.0, absmax),
        compared_with=compared_with,
        batch_sizes=tuple(b[0].shape[0] if b[0].dim() else 1 for b in batches),
        cosine_to_float=cosine_to_float,
        failure=failure,
    )


def _failure(verdict: Callable[..., object], *args: Any) -> str | None:
    """The judge's reason for rejecting, or None when ``verdict(*args)`` passes."""
    try:
        verdict(*args)
    except OutputMismatchError as exc:
        return str(exc)
    return None
