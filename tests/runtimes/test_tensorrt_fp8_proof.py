"""``precision="fp8"`` against NVIDIA's real TensorRT 11.0 bindings and Torch-TensorRT 2.13's
source, on CPU (:mod:`tests.tensorrt_api`).

The FP8 file goes through the same validated builder, parser and engine calls as any other; the
stand-in engine runs it with ONNX Runtime. Torch-TensorRT 2.13 converts FP8 ``quantize_op`` per
tensor only, so FP8 with ``runtime="torch_tensorrt"`` goes the ONNX -> TensorRT way: its source
is read here to keep that reason true.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto

import embedl_dynamo
from tests.runtimes.test_tensorrt_real_api import real_trt, tensorrt_on_cpu  # noqa: F401
from tests.tensorrt_api import PROOF_DIR


class _Net(torch.nn.Module):
    """FP8 convs and a linear; GELU, so no Relu sits before a Q (the stand-in engine's plain
    ONNX Runtime session would drop it, see tests/quant/test_fp8.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.gelu(self.b(F.gelu(self.a(x)))).mean((2, 3)))


def _fp8_files(root: Path) -> list[onnx.ModelProto]:
    found = []
    for path in root.rglob("*.onnx"):
        model = onnx.load(str(path), load_external_data=False)
        zeros = {i.name for i in model.graph.initializer} | {
            n.output[0] for n in model.graph.node if n.op_type == "Constant"
        }
        types = {
            n.attribute[0].t.data_type
            for n in model.graph.node
            if n.op_type == "Constant" and n.output[0] in zeros
        }
        if TensorProto.FLOAT8E4M3FN in types:
            found.append(model)
    return found


def _compile(tmp_path: Path, runtime: str):
    torch.manual_seed(0)
    model = _Net().eval()
    batches = [torch.randn(2, 3, 8, 8) for _ in range(3)]
    options = {
        "runtime": runtime,
        "precision": "fp8",
        "calibration_data": batches,
        "cache_dir": str(tmp_path),
        "fallback": "raise",
    }
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.inference_mode():
        out = compiled(batches[0])
        expected = model(batches[0])
    return out, expected


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def test_the_fp8_network_goes_through_the_real_tensorrt_api(tensorrt_on_cpu, tmp_path):  # noqa: F811
    out, expected = _compile(tmp_path, "tensorrt")
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "tensorrt" and sub.pipeline["precision"] == "fp8"
    calls = tensorrt_on_cpu.api.calls
    for call in (
        "OnnxParser.parse",
        "Builder.build_serialized_network",
        "IExecutionContext.execute_async_v3",
    ):
        assert call in calls, call
    (profile,) = tensorrt_on_cpu.profiles
    real = tensorrt_on_cpu.api.trt
    # strongly typed: the file's FP8 Q/DQ decide the precision; TensorRT 11 has the FP8 type
    assert profile["flags"] == 1 << int(real.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert hasattr(real.DataType, "FP8")
    (parsed,) = _fp8_files(tmp_path)
    assert parsed.opset_import[0].version >= 19
    assert _cosine(out, expected) > 0.99


def test_fp8_on_torch_tensorrt_goes_onnx_to_tensorrt_and_says_why(
    tensorrt_on_cpu,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime

    monkeypatch.setattr(TorchTensorRTRuntime, "missing", classmethod(lambda cls: None))
    out, expected = _compile(tmp_path, "torch_tensorrt")
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "tensorrt" and sub.pipeline["precision"] == "fp8"
    assert "FP8 through ONNX -> TensorRT" in sub.reason and "per tensor only" in sub.reason
    assert _cosine(out, expected) > 0.99


def test_torch_tensorrt_converts_fp8_quantize_op_per_tensor_only():
    """The reason FP8 does not take the Torch-TensorRT way (fails once that changes)."""
    source = PROOF_DIR / "torch_tensorrt" / "dynamo" / "conversion" / "impl" / "quantize.py"
    if not source.is_file():
        pytest.skip("Torch-TensorRT's package is not installed for the CPU proofs")
    text = source.read_text()
    assert "exponent_bits == 4" in text and "trt.DataType.FP8" in text
    assert "fp8 weight/activation quantization is per-tensor quantization" in text
    assert "dtype == trt.DataType.INT8 and amax.numel() > 1" in text  # per channel: INT8 only


def test_to_torch_tensorrt_qdq_refuses_fp8_with_the_fix():
    from embedl_dynamo.quant.fp8.qdq import FP8FakeQuantize
    from embedl_dynamo.quant.int8.torch_tensorrt_qdq import to_torch_tensorrt_qdq

    root = torch.nn.Module()
    root.fq = FP8FakeQuantize(1.0)
    graph = torch.fx.Graph()
    graph.output(graph.call_module("fq", (graph.placeholder("x"),)))
    gm = torch.fx.GraphModule(root, graph)
    with pytest.raises(ValueError, match="FP8 per tensor only.*use runtime='tensorrt'"):
        to_torch_tensorrt_qdq(gm)
