"""Under ``auto``, a precision one runtime's kernels lead is built on that runtime.

Before, ``torch.compile(backend="embedl_tensorrt", options={"precision": "int4_weight_only"})``
on a CPU with both runtimes built the decoder on OpenVINO, the target's first CPU runtime,
whose compressed-weight matmuls ran our artifact at 1.5x ONNX Runtime's ``MatMulNBits`` per
token (``python -m bench run llm_decode``, a Qwen2.5-0.5B-shaped decoder).
"""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.tuning.routing import precision_route

needs_openvino = pytest.mark.skipif(
    OpenVINORuntime.missing() is not None, reason="needs openvino (the [openvino] extra)"
)


@pytest.mark.parametrize("name", ["int8_weight_only", "int4_weight_only"])
def test_weight_only_puts_onnxruntime_first(name):
    order, note = precision_route([OpenVINORuntime, OnnxRuntime], get_precision(name))
    assert order == [OnnxRuntime, OpenVINORuntime]
    assert note.startswith(f"auto: onnxruntime for {name} by the precision rule")


@pytest.mark.parametrize(
    ("candidates", "name", "why"),
    [
        ([OpenVINORuntime, OnnxRuntime], "int8", "no rule for activation INT8"),
        ([OpenVINORuntime, OnnxRuntime], "fp32", "no rule for float"),
        ([OpenVINORuntime], "int4_weight_only", "the leader is not installed, or forced away"),
        ([OnnxRuntime, OpenVINORuntime], "int4_weight_only", "the leader is first already"),
    ],
)
def test_no_rule_keeps_the_targets_order(candidates, name, why):
    order, note = precision_route(list(candidates), get_precision(name))
    assert order == candidates, why
    assert note == "", why


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


@needs_openvino
def test_the_tensorrt_targets_weight_only_runs_on_onnxruntime_under_auto(compile_isolation):
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(4, 64)
    options = {"precision": "int8_weight_only", "runtime": "auto"}
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        out, reference = compiled(x), model(x)
    (subgraph,) = embedl_dynamo.last_report().subgraphs
    assert subgraph.status == "compiled" and subgraph.runtime == "onnxruntime", subgraph.reason
    assert "onnxruntime for int8_weight_only by the precision rule" in subgraph.reason
    assert subgraph.pipeline["weight_only"]["bits"] == 8
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), dim=0)
    assert cosine > 0.999
