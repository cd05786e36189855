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
