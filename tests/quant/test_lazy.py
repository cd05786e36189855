"""INT8 calibrated on its first calls (:mod:`embedl_dynamo.quant.int8.lazy`): a call with NaN or
infinity is answered by the float graph and not calibrated on, so calibration still finishes
(issue 50 item 7: one NaN used to fail every calibration after it)."""

from __future__ import annotations

import torch

import embedl_dynamo
from embedl_dynamo.backends.onnxruntime import BACKEND
from embedl_dynamo.quant.int8.lazy import calibrate_then_build
from embedl_dynamo.settings import Settings
from tests.models import TinyConvNet

X = torch.randn(2, 3, 8, 8)


def test_calls_with_nan_or_inf_are_answered_in_float_and_not_calibrated_on(tmp_path):
    model = TinyConvNet().eval()
    patterns = [*BACKEND.conversion_patterns, *BACKEND.fusion_patterns]
    fused = embedl_dynamo.transform(model, (X,), patterns).model
    built = []
    settings = Settings(calibration_steps=2, cache_dir=tmp_path)
    lazy = calibrate_then_build(
        fused, [X], BACKEND.quantizer, settings, lambda q: built.append(q) or q
    )
    with torch.no_grad():
        for bad in (float("nan"), float("inf")):
            x = X.clone()
            x[0, 0, 0, 0] = bad
            out = lazy(x)
            assert torch.equal(out.isfinite(), model(x).isfinite())
            assert not out[0].isfinite().any()
        assert lazy.steps_seen == 0 and lazy.phase == "calibrating"
        lazy(X)
        lazy(X * 2)
    assert lazy.steps_seen == 2 and lazy.phase == "quantized" and len(built) == 1
