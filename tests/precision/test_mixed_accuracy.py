"""Mixed precision on real data (scikit-learn digits): a depthwise + squeeze-excite CNN trained
in the test keeps its top-1 accuracy within half a point of float."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from tests.quant.digits import DigitsMobileCNN, accuracy, train_digits_cnn


@pytest.mark.parametrize("precision", ["mixed", "int8"])
def test_precision_on_digits_holds_half_a_point_of_top1(precision, tmp_path) -> None:
    model, (x_train, _, x_test, y_test) = train_digits_cnn(epochs=6, make=DigitsMobileCNN)
    float_acc = accuracy(model, x_test, y_test)
    assert float_acc > 90.0
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={
            "precision": precision,
            "calibration_data": list(x_train[:256].split(64)),
            "cache_dir": str(tmp_path),
            "fallback": "raise",
        },
    )
    got = accuracy(compiled, x_test, y_test)
    sub = embedl_dynamo.last_report().subgraphs[0]
    assert sub.runtime == "onnxruntime" and sub.pipeline["precision"] == precision
    assert got >= float_acc - 0.5, (precision, got, float_acc)
    if precision == "mixed":  # every layer decided, each with its reason
        assert sub.pipeline["layers"] and all(r["reason"] for r in sub.pipeline["layers"])
