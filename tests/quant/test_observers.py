"""Calibrators (min/max, percentile, histogram MSE / entropy) and scale computation."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo.errors import NonFiniteError
from embedl_dynamo.quant.int8.observers import (
    HistogramCalibrator,
    MinMaxCalibrator,
    PercentileCalibrator,
    make_calibrator,
    scale_zero_point,
)
from embedl_dynamo.quant.int8.spec import QuantizationSpec


def _data_with_outlier():
    torch.manual_seed(0)
    batches = [torch.randn(4096) for _ in range(3)]
    batches[1][7] = 40.0  # one outlier
    return batches


def test_minmax_tracks_extremes_and_resets():
    c = MinMaxCalibrator("x")
    c.collect(torch.tensor([-1.0, 2.0]))
    c.collect(torch.tensor([-3.0, 0.5]))
    assert c.compute_range() == (-3.0, 2.0)
    assert c.compute_amax() == 3.0
    c.reset()
    with pytest.raises(RuntimeError, match="calibrator for 'x' saw no data"):
        c.compute_amax()


@pytest.mark.parametrize(
    "calibrator",
    [
        PercentileCalibrator("x", 99.9),
        HistogramCalibrator("x", "entropy"),
    ],
)
def test_clipping_calibrators_ignore_an_outlier(calibrator):
    for batch in _data_with_outlier():
        calibrator.collect(batch)
    amax = calibrator.compute_amax()
    assert 2.0 < amax < 20.0  # min/max would say 40
    lo, hi = calibrator.compute_range()
    assert lo < 0 < hi and hi <= 40.0


def _quant_mse(x: torch.Tensor, amax: float) -> float:
    scale = amax / 127
    q = torch.clamp(torch.round(x / scale), -127, 127) * scale
    return float(((x - q) ** 2).mean())


def test_mse_calibrator_picks_a_lower_error_clip_than_minmax():
    torch.manual_seed(0)
    x = torch.distributions.Laplace(0.0, 1.0).sample((20000,))  # heavy tails
    c = HistogramCalibrator("x", "mse")
    c.collect(x)
    amax = c.compute_amax()
    full = float(x.abs().max())
    assert amax < full
    assert _quant_mse(x, amax) < _quant_mse(x, full)


def test_histogram_rebins_when_range_grows():
    c = HistogramCalibrator("x", "mse", bins=256)
    c.collect(torch.linspace(0, 1, 1000))
    c.collect(torch.linspace(0, 3, 1000))
    assert c._edge >= 3.0
    assert float(c._hist.sum()) == 2000.0


def test_non_finite_values_raise_naming_the_tensor():
    c = make_calibrator(QuantizationSpec(), name="layer1.0.conv1")
    with pytest.raises(NonFiniteError, match="'layer1.0.conv1' holds 1 non-finite"):
        c.collect(torch.tensor([1.0, float("nan")]))


def test_make_calibrator_follows_the_spec():
    assert isinstance(make_calibrator(QuantizationSpec(observer="minmax")), MinMaxCalibrator)
    p = make_calibrator(QuantizationSpec(observer="percentile", percentile=99.0))
    assert isinstance(p, PercentileCalibrator) and p.percentile == 99.0
    assert make_calibrator(QuantizationSpec(observer="entropy")).method == "entropy"


def test_scale_zero_point_math():
    sym = QuantizationSpec("int8", symmetric=True)
    scale, zp = scale_zero_point(sym, -2.54, 1.0)
    assert float(scale) == pytest.approx(2.54 / 127) and int(zp) == 0
    aff = QuantizationSpec("uint8", symmetric=False)
    scale, zp = scale_zero_point(aff, -1.0, 3.0)
    assert float(scale) == pytest.approx(4.0 / 255)
    assert int(zp) == round(1.0 / (4.0 / 255))
    # a range not containing zero is widened to contain it
    scale, zp = scale_zero_point(aff, 1.0, 2.0)
    assert int(zp) == 0 and float(scale) == pytest.approx(2.0 / 255)
    per_channel = QuantizationSpec("int8", per_channel=True, axis=0, narrow_range=True)
    scale, zp = scale_zero_point(per_channel, torch.tensor([-1.0, 0.0]), torch.tensor([0.5, 0.0]))
    assert scale.shape == (2,) and float(scale[1]) > 0  # an all-zero channel stays finite


def test_mean_minmax_averages_each_batchs_range_as_nncf_does():
    from embedl_dynamo.quant.int8.observers import MeanMinMaxCalibrator, make_calibrator
    from embedl_dynamo.quant.int8.spec import OPENVINO_INT8
    from embedl_dynamo.rewrite.qdq import Role

    calibrator = MeanMinMaxCalibrator("x")
    for batch in (torch.tensor([0.0, 1.0]), torch.tensor([-1.0, 3.0]), torch.tensor([1.0, 11.0])):
        calibrator.collect(batch)
    assert calibrator.compute_range() == (0.0, 5.0)  # means of (0, -1, 1) and (1, 3, 11)
    assert calibrator.compute_amax() == 5.0
    assert (calibrator.min, calibrator.max) == (-1.0, 11.0)  # the extremes stay known
    # the openvino target's activations use it (NNCF's MEAN_MINMAX); weights stay min/max
    assert isinstance(make_calibrator(OPENVINO_INT8.spec(Role.ACTIVATION)), MeanMinMaxCalibrator)
    assert OPENVINO_INT8.spec(Role.WEIGHT).observer == "minmax"
