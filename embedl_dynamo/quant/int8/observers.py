"""Calibrators: collect statistics of a tensor over calibration batches, then pick its range.

Three-method protocol as in ModelOpt: ``collect(x)``, ``reset()``, ``compute_amax()``; plus
``compute_range()`` -> ``(min, max)`` for affine (uint8) specs. Kinds:

* ``minmax``: the running min and max;
* ``percentile``: the given percentile of ``|x|`` (resp. of the low/high tails), averaged
  over batches;
* ``mse``: a histogram of ``|x|``; the clip value minimising the expected squared quantization
  error ``sum_i h_i * E[(x_i - Q(x_i))^2]`` over candidate thresholds;
* ``entropy``: the KL-divergence threshold search of TensorRT's entropy calibrator.

:func:`scale_zero_point` turns a range into ``(scale, zero_point)`` for a spec.
"""

from __future__ import annotations

import math

import torch

from embedl_dynamo.errors import NonFiniteError
from embedl_dynamo.quant.int8.spec import QuantizationSpec

__all__ = [
    "Calibrator",
    "HistogramCalibrator",
    "MinMaxCalibrator",
    "PercentileCalibrator",
    "make_calibrator",
    "scale_zero_point",
]


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).sum())
        raise NonFiniteError(
            f"tensor {name!r} holds {bad} non-finite value(s) (NaN/inf) during calibration; "
            "check the calibration data and the model for overflow before quantizing"
        )


class Calibrator:
    """Base calibrator; ``name`` is the tensor it observes (used in error messages)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.min: float | None = None
        self.max: float | None = None
        self.batches = 0

    def collect(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        _check_finite(x, self.name)
        lo, hi = float(x.min()), float(x.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self.batches += 1
        self.observed(lo, hi)

    def observed(self, lo: float, hi: float) -> None:
        """One batch's minimum and maximum, after :meth:`collect` has counted them."""

    def require_data(self) -> None:
        """Raise, naming the tensor, when no calibration batch reached this observer."""
        if self.batches == 0:
            raise RuntimeError(
                f"calibrator for {self.name!r} saw no data: run at least one calibration batch "
                "through the model (is the tensor on the executed path?)"
            )

    def compute_amax(self) -> float:
        self.require_data()
        return max(abs(self.min), abs(self.max))

    def compute_range(self) -> tuple[float, float]:
        self.require_data()
        return self.min, self.max


class MinMaxCalibrator(Calibrator):
    """The running min/max of every value seen."""


class MeanMinMaxCalibrator(Calibrator):
    """The mean over calibration batches of each batch's minimum and maximum (NNCF's default
    for per-tensor activations, ``MEAN_MINMAX``): one batch with an extreme value widens the
    range by its share of the batches, not wholly, so the other values keep finer steps."""

    def reset(self) -> None:
        super().reset()
        self._lo: list[float] = []
        self._hi: list[float] = []

    def observed(self, lo: float, hi: float) -> None:
        self._lo.append(lo)
        self._hi.append(hi)

    def compute_amax(self) -> float:
        lo, hi = self.compute_range()
        return max(abs(lo), abs(hi))

    def compute_range(self) -> tuple[float, float]:
        self.require_data()
        return sum(self._lo) / len(self._lo), sum(self._hi) / len(self._hi)


class PercentileCalibrator(Calibrator):
    """Clip at a percentile of the data (mean over batches) to ignore rare outliers."""

    def __init__(self, name: str = "", percentile: float = 99.99) -> None:
        self.percentile = percentile
        super().__init__(name)

    def reset(self) -> None:
        super().reset()
        self._amax: list[float] = []
        self._lo: list[float] = []
        self._hi: list[float] = []

    def collect(self, x: torch.Tensor) -> None:
        super().collect(x)
        flat = x.detach().float().reshape(-1)
        if flat.numel() > 1_000_000:
            flat = flat[
                torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))[:1_000_000]
            ]
        q = self.percentile / 100.0
        self._amax.append(float(torch.quantile(flat.abs(), q)))
        self._lo.append(float(torch.quantile(flat, 1.0 - q)))
        self._hi.append(float(torch.quantile(flat, q)))

    def compute_amax(self) -> float:
        self.require_data()
        return sum(self._amax) / len(self._amax)

    def compute_range(self) -> tuple[float, float]:
        self.require_data()
        return sum(self._lo) / len(self._lo), sum(self._hi) / len(self._hi)


class HistogramCalibrator(Calibrator):
    """A histogram of ``|x|`` (and of ``x``) searched for the MSE- or KL-optimal clip.

    Args:
        method: ``"mse"`` or ``"entropy"``.
        bins: histogram resolution.
    """

    def __init__(self, name: str = "", method: str = "mse", bins: int = 2048) -> None:
        if method not in ("mse", "entropy"):
            raise ValueError(f"unknown histogram method {method!r}; known: ['entropy', 'mse']")
        self.method, self.bins = method, bins
        super().__init__(name)

    def reset(self) -> None:
        super().reset()
        self._hist: torch.Tensor | None = None
        self._edge = 0.0  # histogram covers [0, _edge]

    def collect(self, x: torch.Tensor) -> None:
        super().collect(x)
        a = x.detach().float().abs().reshape(-1)
        top = float(a.max()) if a.numel() else 0.0
        if self._hist is None:
            self._edge = max(top, 1e-12)
            self._hist = torch.histc(a, self.bins, 0.0, self._edge).double()
            return
        if top > self._edge:  # re-bin the old histogram onto the wider range
            factor = math.ceil(top / self._edge)
            new_edge = self._edge * factor
            old = self._hist
            merged = torch.zeros(self.bins, dtype=torch.float64)
            index = torch.div(torch.arange(self.bins), factor, rounding_mode="floor")
            merged.index_add_(0, index, old)
            self._hist, self._edge = merged, new_edge
        self._hist += torch.histc(a, self.bins, 0.0, self._edge).double()

    def _mse(self, centers: torch.Tensor, hist: torch.Tensor, levels: int) -> float:
        best, best_amax = math.inf, self._edge
        for i in range(self.bins // 16, self.bins + 1, max(1, self.bins // 256)):
            amax = self._edge * i / self.bins
            scale = amax / levels
            q = torch.clamp(torch.round(centers / scale), 0, levels) * scale
            err = float((hist * (centers - q) ** 2).sum())
            if err < best:
                best, best_amax = err, amax
        return best_amax

    def _entropy(self, hist: torch.Tensor, levels: int) -> float:
        best, best_i = math.inf, self.bins
        total = hist.sum()
        for i in range(max(levels, self.bins // 16), self.bins + 1, max(1, self.bins // 256)):
            p = hist[:i].clone()
            p[-1] += hist[i:].sum()
            # quantize p into `levels` buckets, expand back over the non-empty bins
            chunks = torch.tensor_split(hist[:i], levels)
            q = torch.cat(
                [
                    torch.where(c > 0, c.sum() / max(int((c > 0).sum()), 1), torch.zeros_like(c))
                    for c in chunks
                ]
            )
            p, q = p / total, q / max(float(q.sum()), 1e-12)
            mask = p > 0
            kl = float((p[mask] * torch.log(p[mask] / torch.clamp(q[mask], min=1e-12))).sum())
            if kl < best:
                best, best_i = kl, i
        return self._edge * best_i / self.bins

    def compute_amax(self) -> float:
        self.require_data()
        hist = self._hist
        width = self._edge / self.bins
        centers = (torch.arange(self.bins, dtype=torch.float64) + 0.5) * width
        if self.method == "mse":
            return self._mse(centers, hist, 127)
        return self._entropy(hist, 128)

    def compute_range(self) -> tuple[float, float]:
        amax = self.compute_amax()
        return max(self.min, -amax), min(self.max, amax)


def make_calibrator(spec: QuantizationSpec, name: str = "") -> Calibrator:
    """The calibrator that ``spec.observer`` names."""
    if spec.observer == "minmax":
        return MinMaxCalibrator(name)
    if spec.observer == "mean_minmax":
        return MeanMinMaxCalibrator(name)
    if spec.observer == "percentile":
        return PercentileCalibrator(name, spec.percentile)
    return HistogramCalibrator(name, spec.observer)


def scale_zero_point(
    spec: QuantizationSpec, lo: float | torch.Tensor, hi: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, zero_point)`` for a range under ``spec`` (tensors; per-channel if given so).

    Symmetric: ``scale = amax / 127`` (TensorRT's convention), zero point at the grid's middle.
    Affine: the range is widened to contain 0, ``scale = (hi - lo) / (qmax - qmin)``,
    ``zero_point = qmin - round(lo / scale)``.
    """
    lo_t = torch.as_tensor(lo, dtype=torch.float64)
    hi_t = torch.as_tensor(hi, dtype=torch.float64)
    qmin, qmax = spec.qmin, spec.qmax
    if spec.symmetric:
        amax = torch.maximum(lo_t.abs(), hi_t.abs())
        scale = amax / 127.0
        zp = torch.full_like(scale, 0 if spec.dtype == "int8" else 128)
    else:
        lo_t = torch.clamp(lo_t, max=0.0)
        hi_t = torch.clamp(hi_t, min=0.0)
        scale = (hi_t - lo_t) / (qmax - qmin)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zp = torch.clamp(qmin - torch.round(lo_t / scale), qmin, qmax)
    scale = torch.clamp(scale, min=1e-8)
    return scale.float(), zp.to(torch.int32)
