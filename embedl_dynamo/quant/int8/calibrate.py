"""Run calibration data through an observed graph and turn the statistics into scales.

Calibration data is either an iterable of batches (a tensor, or a tuple/list of positional
inputs) or a callable ``forward_loop(model)`` that owns the loop (ModelOpt's convention). A
``tqdm`` bar runs over iterable batches when ``progress`` is true and stderr is a TTY.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.errors import CalibrationDataError, NonFiniteError, error_line
from embedl_dynamo.quant.int8.observers import Calibrator, scale_zero_point
from embedl_dynamo.quant.int8.placement import Placement
from embedl_dynamo.quant.int8.spec import QuantizationConfig

__all__ = [
    "CalibrationData",
    "as_batches",
    "calibrate",
    "check_batches_finite",
    "calibration_mismatch",
    "data_fingerprint",
    "fit_batches_to_graph",
    "ranges_from_calibrators",
]

logger = logging.getLogger(__name__)

CalibrationData = Iterable[Any] | Callable[[nn.Module], Any]


class _Counting(nn.Module):
    """Wraps the observed graph so every forward pass is counted, whoever owns the loop."""

    def __init__(self, gm: nn.Module) -> None:
        super().__init__()
        self.gm = gm
        self.passes = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self.gm(*args, **kwargs)


def as_batches(data: Iterable[Any]) -> list[tuple[torch.Tensor, ...]]:
    """Materialise an iterable of tensors or tuples of tensors as a list of argument tuples."""
    if isinstance(data, torch.Tensor):
        raise CalibrationDataError(
            "calibration_data is a single tensor; pass an iterable of batches, e.g. "
            "list(tensor.split(32)), or a callable forward_loop(model)"
        )
    batches = []
    for batch in data:
        if isinstance(batch, torch.Tensor):
            batches.append((batch,))
        elif isinstance(batch, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in batch):
            batches.append(tuple(batch))
        else:
            raise CalibrationDataError(
                f"calibration batch of type {type(batch).__name__} is not a tensor or a tuple of "
                "tensors; pass batches of model inputs or a callable forward_loop(model)"
            )
    if not batches:
        raise CalibrationDataError(
            "calibration_data is empty: give at least one batch (a generator can be consumed "
            "only once; pass a list to calibrate several models)"
        )
    return batches


def calibration_mismatch(data: Any, inputs: Sequence[torch.Tensor]) -> str:
    """Why calibration batches cannot feed a subgraph with these ``inputs`` ("" if they can).

    Only batch lists are checked (a forward_loop drives whatever it drives); the batch axis may
    differ, every other size and the dtype must match.
    """
    if callable(data) and not isinstance(data, (list, tuple)):
        return ""
    batches = as_batches(data) if isinstance(data, (list, tuple)) else None
    if not batches:
        return ""
    batch = batches[0]
    if len(batch) != len(inputs):
        return f"{len(batch)} tensors per batch, the subgraph takes {len(inputs)}"
    for i, (given, wanted) in enumerate(zip(batch, inputs)):
        if given.dtype != wanted.dtype or tuple(given.shape[1:]) != tuple(wanted.shape[1:]):
            return (
                f"input {i} is {given.dtype} {tuple(given.shape)}, the subgraph takes "
                f"{wanted.dtype} {tuple(wanted.shape)}"
            )
    return ""


def fit_batches_to_graph(
    gm: Callable[..., Any], data: Any, inputs: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, ...]] | None:
    """Calibration batches that run through ``gm``, re-batched to the inputs' batch if needed.

    A graph Dynamo compiled for one batch size can hold it as a constant (``x.expand(540,
    ...)``), so batches of another size fail inside it. Then the samples are regrouped into
    batches of the example's size (a remainder is dropped). Batch lists only; a forward_loop,
    or batches that already run, are returned as given (None for a forward_loop).

    Returns:
        The batches to calibrate on, or None when the data is a forward_loop or no regrouped
        batch can be formed (fewer samples than one example batch).
    """
    if callable(data) and not isinstance(data, (list, tuple)):
        return None
    batches = as_batches(data)
    size = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 0
    if not batches or size == 0 or all(int(b[0].shape[0]) == size for b in batches):
        return batches
    try:  # FX prints a failing graph's code to stderr: keep the probe quiet
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
            gm(*batches[0])
        return batches
    except Exception as exc:  # a shape error inside the graph: regroup below
        reason = error_line(exc, with_type=False)
    columns = [torch.cat([b[i] for b in batches]) for i in range(len(batches[0]))]
    count = int(columns[0].shape[0]) // size
    logger.info(
        "calibration batches do not run through a graph compiled for batch %d (%s); "
        "regrouped %d samples into %d batches of %d",
        size,
        reason,
        columns[0].shape[0],
        count,
        size,
    )
    if count == 0:
        return None
    return [tuple(c[k * size : (k + 1) * size] for c in columns) for k in range(count)]


def check_batches_finite(batches: Sequence[tuple[torch.Tensor, ...]]) -> None:
    """Raise :class:`NonFiniteError` naming the first input holding NaN or infinity."""
    for b, batch in enumerate(batches):
        for i, tensor in enumerate(batch):
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise NonFiniteError(
                    f"calibration input {i} of batch {b} holds non-finite values (NaN/inf); "
                    "clean the calibration data"
                )


def _callable_fingerprint(fn: Callable[..., Any]) -> str:
    """Identify a forward_loop by its qualified name, bytecode and constant closure values."""
    h = hashlib.sha256(getattr(fn, "__qualname__", repr(type(fn))).encode())
    code = getattr(fn, "__code__", None)
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        _hash_value(h, value)
    return h.hexdigest()


def _hash_value(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, (list, tuple)):
        for v in value:
            _hash_value(h, v)
    elif isinstance(value, (int, float, str, bool)) or value is None:
        h.update(repr(value).encode())
    else:
        h.update(type(value).__qualname__.encode())


class _Probed(Exception):
    """Raised by :class:`_InputProbe` once it has seen enough batches."""


class _InputProbe(nn.Module):
    """Stands in for the model a forward_loop drives: records the first batches it is fed."""

    def __init__(self, model: nn.Module, batches: int) -> None:
        super().__init__()
        self.model, self.limit, self.seen = model, batches, []

    def forward(self, *args: Any) -> Any:
        self.seen.append(args)
        if len(self.seen) >= self.limit:
            raise _Probed
        return self.model(*args)


def data_fingerprint(
    data: CalibrationData | Sequence[tuple[torch.Tensor, ...]],
    model: nn.Module | None = None,
    probe_batches: int = 2,
) -> str | None:
    """sha256 of calibration data: the tensor bytes of every batch.

    A ``forward_loop`` is fingerprinted by what it feeds the model: it runs on ``model`` until
    it has fed ``probe_batches`` batches, whose bytes are hashed with the loop's code. Data the
    loop reads from a file or a loader is seen that way too (rescaled data gives another key).

    Returns:
        The fingerprint, or None when a loop cannot be fingerprinted (no model given, the loop
        fails, or it feeds nothing): such data must not be cached.
    """
    if callable(data) and not isinstance(data, (list, tuple)):
        if model is None:
            return None
        probe = _InputProbe(model, probe_batches)
        try:
            with torch.no_grad():
                data(probe)
        except _Probed:
            pass
        except Exception as exc:  # the real calibration run will report it
            logger.debug("forward_loop cannot be fingerprinted: %s", exc)
            return None
        if not probe.seen:
            return None
        h = hashlib.sha256(_callable_fingerprint(data).encode())
        for batch in probe.seen:
            _hash_value(h, batch)
        return "loop:" + h.hexdigest()
    h = hashlib.sha256()
    for batch in data:
        _hash_value(h, batch)
    return "data:" + h.hexdigest()


def _use_bar(progress: bool) -> bool:
    return bool(progress) and sys.stderr.isatty()


def calibrate(
    observed: fx.GraphModule,
    data: CalibrationData | Sequence[tuple[torch.Tensor, ...]],
    progress: bool = True,
) -> int:
    """Run ``data`` through ``observed`` (its observers collect statistics).

    Args:
        observed: the graph with observers (from :func:`~.insert.insert_observers`).
        data: batches, or a callable ``forward_loop(model)``.
        progress: show a tqdm bar over batches (only on a TTY).

    Returns:
        The number of forward passes run.
    """
    model = _Counting(observed).eval()
    with torch.no_grad():
        if callable(data) and not isinstance(data, (list, tuple)):
            try:
                data(model)
            except Exception as exc:
                raise CalibrationDataError(
                    f"the calibration forward_loop raised {type(exc).__name__}: {exc}"
                ) from exc
        else:
            from tqdm.auto import tqdm

            batches = data if isinstance(data, list) else as_batches(data)
            for batch in tqdm(
                batches, desc="calibrating", unit="batch", disable=not _use_bar(progress)
            ):
                model(*batch)
    passes = model.passes
    if passes == 0:
        raise CalibrationDataError("the calibration forward_loop never called the model")
    logger.info("calibrated on %d forward passes", passes)
    return passes


def ranges_from_calibrators(
    calibrators: Mapping[str, Calibrator], placement: Placement, config: QuantizationConfig
) -> dict[str, dict[str, Any]]:
    """``{node name: {"tensor", "dtype", "scale", "zero_point", "min", "max"}}`` (JSON-ready)."""
    ranges: dict[str, dict[str, Any]] = {}
    for name, calibrator in calibrators.items():
        spec = config.spec(placement.activations[name])
        if spec.unsigned_nonnegative:
            calibrator.require_data()
            spec = spec.for_range(float(calibrator.min))
        if spec.symmetric:
            amax = calibrator.compute_amax()
            lo, hi = -amax, amax
        elif spec.dtype == "uint8" and float(calibrator.min) >= 0.0:
            lo, hi = 0.0, calibrator.compute_amax()  # a non-negative tensor: [0, max]
        else:
            lo, hi = calibrator.compute_range()
        scale, zp = scale_zero_point(spec, lo, hi)
        ranges[name] = {
            "tensor": calibrator.name,
            "dtype": spec.dtype,
            "scale": float(scale),
            "zero_point": int(zp),
            "min": float(lo),
            "max": float(hi),
        }
    return ranges
