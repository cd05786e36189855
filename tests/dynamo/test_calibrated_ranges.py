"""INT8 warns when inference inputs leave the ranges calibration saw (issue 23 item 5)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import embedl_dynamo


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU()).eval()


def _int8(model: nn.Module, calibration: list[torch.Tensor]):
    options = {"precision": "int8", "calibration_data": calibration, "accuracy_budget": 0.9}
    return torch.compile(model, backend="embedl_onnxruntime", options=options)


def test_inputs_far_outside_the_calibrated_range_warn_once():
    model = _net()
    calibration = [torch.randn(2, 3, 16, 16) for _ in range(4)]
    compiled = _int8(model, calibration)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        compiled(calibration[0])
        assert embedl_dynamo.last_report().subgraphs[0].runtime == "onnxruntime"
        compiled(torch.randn(2, 3, 16, 16))  # like the calibration data: no warning
        assert not [w for w in caught if "calibration saw" in str(w.message)]
        for _ in range(3):
            compiled(torch.randn(2, 3, 16, 16) * 255)
    found = [str(w.message) for w in caught if "calibration saw" in str(w.message)]
    assert len(found) == 1 and "INT8 clips it" in found[0], found


def test_after_its_first_calls_the_watch_samples_one_call_in_eight():
    from embedl_dynamo.dynamo.compiled_call import (
        WATCH_EVERY_CALL,
        WATCH_STRIDE,
        watch_calibrated_ranges,
    )

    seen = []
    watched = watch_calibrated_ranges(lambda x: seen.append(x) or x, {0: 1.0}, index=0)
    calm, wild = torch.ones(4), torch.full((4,), 100.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(WATCH_EVERY_CALL):
            watched(calm)
        for _ in range(WATCH_STRIDE - 1):  # calls the sample skips: no warning yet
            watched(wild)
        assert not caught
        watched(wild)  # the sampled call
    assert len(caught) == 1 and "INT8 clips it" in str(caught[0].message)
    assert len(seen) == WATCH_EVERY_CALL + WATCH_STRIDE  # every call still ran
