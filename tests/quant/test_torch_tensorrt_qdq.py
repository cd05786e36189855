"""Torch-TensorRT's QDQ form (``tensorrt::quantize_op``): where present; skipped with a reason here."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo import quantize
from embedl_dynamo.quant.int8.torch_tensorrt_qdq import has_quantize_op, to_torch_tensorrt_qdq
from tests.models import ResNetLike


def test_missing_op_is_a_clear_error():
    if has_quantize_op():
        pytest.skip("tensorrt::quantize_op is registered here")
    x = torch.randn(1, 3, 32, 32)
    q = quantize(ResNetLike().eval(), (x,), backend="tensorrt", calibration_data=[x])
    with pytest.raises(RuntimeError, match="install nvidia-modelopt"):
        to_torch_tensorrt_qdq(q)


@pytest.mark.tensorrt
@pytest.mark.skipif(
    not has_quantize_op(),
    reason="tensorrt::quantize_op needs ModelOpt / Torch-TensorRT (not installable here)",
)
def test_quantize_op_graph_matches_fake_quant():
    x = torch.randn(1, 3, 32, 32)
    q = quantize(ResNetLike().eval(), (x,), backend="tensorrt", calibration_data=[x])
    trt = to_torch_tensorrt_qdq(q)
    ops = [n.target for n in trt.graph.nodes if n.op == "call_function"]
    assert torch.ops.tensorrt.quantize_op in ops
    torch.testing.assert_close(trt(x), q(x), atol=1e-4, rtol=1e-4)


def test_asymmetric_quantizers_are_refused():
    from embedl_dynamo.quant.int8.torch_tensorrt_qdq import _amax

    with pytest.raises(ValueError, match="asymmetric"):
        _amax(torch.tensor(0.1), torch.tensor(128), "x")
