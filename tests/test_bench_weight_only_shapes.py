"""bench/probes/weight_only_shapes.py's files compute what the benchmark says they do: each copy is an
int4 weight-only matmul (codes blocked along K, scales, zero points) of the one input."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper

from bench.probes.weight_only_kernels import BLOCK
from bench.probes.weight_only_shapes import copies_model


def _unpacked(tensor: onnx.TensorProto) -> np.ndarray:
    packed = np.frombuffer(tensor.raw_data, np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(tuple(tensor.dims))


def test_each_copy_is_an_int4_weight_only_matmul_of_the_input(tmp_path):
    k, n, copies = 2 * BLOCK, 16, 3
    path = tmp_path / "copies.onnx"
    copies_model(k, n, copies, path)
    model = onnx.load(str(path))
    weights = {t.name: t for t in model.graph.initializer}
    x = np.random.default_rng(2).random((1, 1, k), dtype=np.float32)
    # the file as written, op by op in float32 (the fused MatMulNBits quantizes the activations)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"x": x})
    assert len(outputs) == copies
    for c, out in enumerate(outputs):
        codes = _unpacked(weights[f"m{c}_q"]).astype(np.float32)  # [K, N]
        zeros = np.repeat(_unpacked(weights[f"m{c}_z"]).astype(np.float32), BLOCK, axis=0)
        scales = np.repeat(numpy_helper.to_array(weights[f"m{c}_s"]), BLOCK, axis=0)
        expected = x @ ((codes - zeros) * scales)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-6)
    assert len({numpy_helper.to_array(weights[f"m{c}_s"]).tobytes() for c in range(copies)}) == 3
