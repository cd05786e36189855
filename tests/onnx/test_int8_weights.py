"""INT8 files keep int8 weight initializers followed by DequantizeLinear, about 4x smaller."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

import embedl_dynamo
from tests.models import ResNetLike, randomize_batchnorm


def test_int8_export_stores_weights_as_int8_and_is_four_times_smaller(tmp_path):
    model = randomize_batchnorm(ResNetLike(width=16).eval())
    x = torch.randn(2, 3, 32, 32)
    batches = [torch.randn(2, 3, 32, 32) for _ in range(2)]
    options = {"cache_dir": tmp_path / "c"}
    fp32 = embedl_dynamo.export(model, x, tmp_path / "fp32.onnx", options=options)
    int8 = embedl_dynamo.export(
        model, x, tmp_path / "int8.onnx", quantize="int8", calibration_data=batches, options=options
    )
    proto = onnx.load(str(int8))
    initializers = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    q_of_constant = [
        n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in initializers
    ]
    assert not q_of_constant  # no float weight quantized at load time
    int8_weights = [a for a in initializers.values() if a.dtype == np.int8 and a.ndim >= 2]
    assert len(int8_weights) >= 10
    assert (
        int8.stat().st_size < 0.4 * fp32.stat().st_size
    )  # 0.36 here: scales and graph are overhead
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert ops["DequantizeLinear"] > ops["QuantizeLinear"]  # weights: DQ only
    session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"input_0": x.numpy()})
    with torch.no_grad():
        reference = model(x).numpy()
    cosine = float((y * reference).sum() / (np.linalg.norm(y) * np.linalg.norm(reference)))
    assert cosine > 0.99
