"""Mixed precision on real data (scikit-learn digits): a depthwise + squeeze-excite CNN and a
small ViT trained in the test keep their top-1 accuracy within half a point of float.

Each model is trained once per module and copied for each precision. The ViT's cases are slow
(its 12 epochs and its compiles: about 15 s); the CNN's run by default."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import embedl_dynamo
from tests.digits import DigitsMobileCNN, DigitsViT, accuracy, train_digits_cnn


@functools.cache
def _trained(make, epochs):
    return train_digits_cnn(epochs=epochs, make=make)


@pytest.mark.parametrize("precision", [pytest.param("mixed", marks=pytest.mark.slow), "int8"])
@pytest.mark.parametrize(
    ("make", "epochs"), [(DigitsMobileCNN, 6), pytest.param(DigitsViT, 12, marks=pytest.mark.slow)]
)
def test_precision_on_digits_holds_half_a_point_of_top1(precision, make, epochs, tmp_path):
    trained, (x_train, _, x_test, y_test) = _trained(make, epochs)
    model = copy.deepcopy(trained)  # each precision compiles a model of its own
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
    # deployed at batch 60: the calibration batches of 64 are regrouped for the ViT, whose
    # graph holds its batch as a constant (the class token's expand)
    got = accuracy(compiled, x_test, y_test, batch=60)
    sub = embedl_dynamo.last_report().subgraphs[0]
    assert sub.runtime == "onnxruntime" and sub.pipeline["precision"] == precision
    assert got >= float_acc - 0.5, (precision, got, float_acc)
    if precision == "mixed":  # every layer decided, each with its reason
        assert sub.pipeline["layers"] and all(r["reason"] for r in sub.pipeline["layers"])
