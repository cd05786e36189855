"""Accuracy on real data (scikit-learn digits): PTQ through torch.compile, ORT's quantizer, QAT."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.variants.ort_quantize import ort_quantize_static
from embedl_dynamo import prepare_qat, quantize
from embedl_dynamo.quant import QuantizationConfig, QuantizationSpec
from embedl_dynamo.rewrite.qdq import Role
from tests.digits import accuracy


def _ort_quantize_static_accuracy(model, x_cal, x_test, y_test, tmp_path) -> float:
    session = ort_quantize_static(model, list(x_cal.split(64)), tmp_path)
    logits = session.run(None, {"x": x_test.numpy()})[0]
    return float((np.argmax(logits, 1) == y_test.numpy()).mean()) * 100.0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_ptq_through_torch_compile_keeps_accuracy(digits, tmp_path):
    model, (x_train, _, x_test, y_test) = digits
    float_acc = accuracy(model, x_test, y_test)
    assert float_acc > 95.0
    x_cal = x_train[:512]
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={
            "quantize": "int8",
            "calibration_data": list(x_cal.split(64)),
            "cache_dir": str(tmp_path / "cache"),
            "fallback": "raise",
        },
    )
    int8_acc = accuracy(compiled, x_test, y_test)
    specialist = _ort_quantize_static_accuracy(model, x_cal, x_test, y_test, tmp_path)
    # accuracies as rounded percentages (float32 vs float64 means of the same count)
    int8_acc, float_acc, specialist = (round(a, 3) for a in (int8_acc, float_acc, specialist))
    assert int8_acc >= float_acc - 0.5, (int8_acc, float_acc)
    assert int8_acc >= specialist, (int8_acc, specialist)


def test_lazy_calibration_on_first_calls(digits, tmp_path, caplog):
    model, (x_train, _, x_test, y_test) = digits
    compiled = torch.compile(
        model,
        backend="embedl_onnxruntime",
        options={"quantize": "int8", "calibration_steps": 4, "cache_dir": str(tmp_path)},
    )
    batches = list(x_train[:256].split(64))
    # inference: under no_grad (in grad mode trainable weights would keep the graph eager)
    with caplog.at_level(logging.INFO, logger="embedl_dynamo.quant.int8.lazy"), torch.no_grad():
        float_out = [compiled(b) for b in batches[:3]]
        for b, out in zip(batches[:3], float_out):
            torch.testing.assert_close(out, model(b), atol=1e-4, rtol=1e-4)  # still float
        compiled(batches[3])
    messages = [r.getMessage() for r in caplog.records]
    assert any("calibrating on the first 4 calls" in m for m in messages)
    assert any("now running the quantized model" in m for m in messages)
    assert accuracy(compiled, x_test, y_test) >= accuracy(model, x_test, y_test) - 1.0


def test_qat_recovers_accuracy_lost_by_ptq(digits):
    model, (x_train, y_train, x_test, y_test) = digits
    # aggressive clipping (75th percentile) makes PTQ lose a lot; QAT learns around it
    clipping = QuantizationConfig(
        {
            Role.ACTIVATION: QuantizationSpec(
                "uint8", symmetric=False, observer="percentile", percentile=75.0
            ),
            Role.WEIGHT: QuantizationSpec("int8", per_channel=True, axis=0),
        },
        name="clipping",
    )
    cal = list(x_train[:256].split(64))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptq = quantize(model, (x_train[:8],), clipping, backend="onnxruntime", calibration_data=cal)
    ptq_acc = accuracy(ptq, x_test, y_test)
    qat = prepare_qat(model, (x_train[:8],), clipping, backend="onnxruntime", calibration_data=cal)
    trainable = [p for p in qat.parameters() if p.requires_grad]
    assert trainable and qat.training
    optimizer = torch.optim.Adam(trainable, lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x_train), generator=gen)
    for i in range(0, len(perm), 64):
        idx = perm[i : i + 64]
        optimizer.zero_grad()
        F.cross_entropy(qat(x_train[idx]), y_train[idx]).backward()
        optimizer.step()
    qat.eval()
    qat_acc = accuracy(qat, x_test, y_test)
    assert ptq_acc < accuracy(model, x_test, y_test) - 20.0  # PTQ really lost accuracy
    assert qat_acc > ptq_acc + 20.0, (ptq_acc, qat_acc)
    # the user's model was not touched
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_qat_freezes_batchnorm_statistics(digits):
    model, (x_train, *_rest) = digits
    qat = prepare_qat(model, (x_train[:8],), backend="onnxruntime", calibration_data=[x_train[:64]])
    qat.train()
    bns = [m for m in qat.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert not bns  # BatchNorm folded into the convolutions: its statistics are constants
    assert all(not m.training for m in bns)
    folded = [m for m in qat.modules() if type(m).__name__.startswith("ParametrizedFusedConv")]
    assert folded and all(m.parametrizations.weight.original.requires_grad for m in folded)
