"""Where ``auto`` runs a graph on a CPU, and with which INT8 placement.

Before, ``torch.compile(backend="embedl_tensorrt", options={"precision": "int8"})`` on a CPU ran
TensorRT's Q/DQ through ONNX Runtime, whose CPU kernels run those convs in float between Q/DQ:
ResNet-50 at 1.02x eager, slower than our float (0.55x). Now each CPU runtime gets the
placement of its own target (``onnxruntime`` / ``openvino``), and ``auto`` prefers OpenVINO for
INT8 where it is installed.
"""

from __future__ import annotations

import collections
import logging

import onnx
import onnxruntime as ort
import pytest
import torch

import embedl_dynamo
from embedl_dynamo import last_report
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.backends.tensorrt import BACKEND as TENSORRT
from embedl_dynamo.errors import RuntimeUnavailableError
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.runtimes.registry import reset_runtimes, runtime_candidates
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.routing import cpu_precision_route
from tests.models import ResNetLike, randomize_batchnorm

needs_openvino = pytest.mark.skipif(
    OpenVINORuntime.missing() is not None, reason="needs openvino (the [openvino] extra)"
)


def _model_and_data():
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    g = torch.Generator().manual_seed(1)
    calibration = [torch.randn(2, 3, 16, 16, generator=g) for _ in range(3)]
    return model, torch.randn(2, 3, 16, 16), calibration


def _compile(tmp_path, runtime):
    model, x, calibration = _model_and_data()
    options = {
        "runtime": runtime,
        "cache_dir": tmp_path,
        "precision": "int8",
        "calibration_data": calibration,
    }
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.inference_mode():
        out, reference = compiled(x), model(x)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), dim=0)
    return last_report().subgraphs[-1], float(cosine)


@needs_openvino
def test_auto_runs_the_tensorrt_targets_int8_on_openvino_with_its_placement(tmp_path):
    subgraph, cosine = _compile(tmp_path, "auto")
    assert subgraph.status == "compiled" and subgraph.runtime == "openvino"
    assert subgraph.reason.startswith("INT8 placed for openvino's integer kernels")
    assert subgraph.pipeline["quantization"]["config"]["name"] == "openvino"
    assert subgraph.runtime_info["int8_layers"]["Convolution"] >= 5
    assert cosine > 0.99


def test_on_onnxruntime_the_tensorrt_targets_int8_uses_integer_kernels(tmp_path):
    subgraph, cosine = _compile(tmp_path, "onnxruntime")
    assert subgraph.status == "compiled" and subgraph.runtime == "onnxruntime"
    assert subgraph.reason.startswith("INT8 placed for onnxruntime's integer kernels")
    assert cosine > 0.99
    embedl_dynamo.wait_for_cache_writes()
    quantized = [
        p
        for p in tmp_path.rglob("*.onnx")
        if any(n.op_type == "QuantizeLinear" for n in onnx.load(str(p)).graph.node)
    ]
    assert quantized
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(str(quantized[0]), options, providers=["CPUExecutionProvider"])
    ops = collections.Counter(
        n.op_type for n in onnx.load(str(tmp_path / "optimised.onnx")).graph.node
    )
    assert ops["QLinearConv"] >= 5 and ops["Conv"] == 0  # the tensorrt placement gives none


@pytest.mark.parametrize(
    ("precision", "runtime", "expected"),
    [
        ("int8", OpenVINORuntime, OPENVINO),
        ("mixed", OpenVINORuntime, OPENVINO),
        ("int8", OnnxRuntime, ONNXRUNTIME),
        ("mixed", OnnxRuntime, ONNXRUNTIME),
        ("fp32", OnnxRuntime, TENSORRT),  # float: nothing changes
        ("int8", TensorRTRuntime, TENSORRT),  # TensorRT runs TensorRT's placement
    ],
)
def test_the_placement_for_each_runtime(precision, runtime, expected):
    backend, note = cpu_precision_route(runtime, TENSORRT, Settings(precision=precision))
    assert backend is expected
    assert bool(note) == (expected is not TENSORRT)


def test_other_targets_keep_their_placement():
    settings = Settings(precision="int8")
    assert cpu_precision_route(OpenVINORuntime, ONNXRUNTIME, settings) == (ONNXRUNTIME, "")


@pytest.mark.parametrize(
    ("backend", "openvino", "on_cuda", "expected"),
    [
        (TENSORRT, True, False, [OpenVINORuntime, OnnxRuntime]),
        (TENSORRT, False, False, [OnnxRuntime]),
        # a graph on a CUDA device: only runtimes that run it there (here ONNX Runtime has
        # the CPU provider alone, and OpenVINO runs on the CPU)
        (TENSORRT, True, True, [TensorRTRuntime]),
        (ONNXRUNTIME, True, False, [OnnxRuntime]),  # ONNX Runtime's target runs on ONNX Runtime
        (ONNXRUNTIME, True, True, [EagerRuntime]),
        (OPENVINO, True, False, [OpenVINORuntime]),
        (OPENVINO, False, False, [EagerRuntime]),  # nothing of its own: stays in PyTorch
    ],
)
def test_auto_candidates_per_target(monkeypatch, backend, openvino, on_cuda, expected):
    monkeypatch.setattr(
        OpenVINORuntime, "missing", classmethod(lambda cls: None if openvino else "not installed")
    )
    monkeypatch.setattr(TensorRTRuntime, "missing", classmethod(lambda cls: None))
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert runtime_candidates("auto", backend, on_cuda) == expected
    assert runtime_candidates("onnxruntime", backend, False) == [OnnxRuntime]  # forced


def test_a_cuda_graph_stays_in_pytorch_without_a_cuda_runtime_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    reset_runtimes()  # forgets what was logged
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.runtimes.registry"):
        assert runtime_candidates("auto", ONNXRUNTIME, on_cuda=True) == [EagerRuntime]
        assert runtime_candidates("auto", ONNXRUNTIME, on_cuda=True) == [EagerRuntime]
    (record,) = caplog.records  # one warning a process, not one a graph
    assert "runs on a CUDA device" in record.getMessage()
    # forced: the error names why and what to do
    with pytest.raises(
        RuntimeUnavailableError, match="no CUDA execution provider.*onnxruntime-gpu"
    ):
        runtime_candidates("onnxruntime", ONNXRUNTIME, on_cuda=True)
    # with ONNX Runtime's CUDA provider installed, the graph runs on ONNX Runtime
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: providers)
    assert runtime_candidates("auto", ONNXRUNTIME, on_cuda=True) == [OnnxRuntime]
    assert runtime_candidates("onnxruntime", ONNXRUNTIME, on_cuda=True) == [OnnxRuntime]


def test_without_a_runtime_for_the_target_dynamos_own_graph_runs(monkeypatch, caplog):
    """No runtime of the target here: the graph Dynamo gave runs (eager's numbers to the bit),
    with one warning and the reason in the report; nothing is exported or built."""
    monkeypatch.setattr(OpenVINORuntime, "missing", classmethod(lambda cls: "not installed"))
    reset_runtimes()
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    model = randomize_batchnorm(model).eval()
    x = torch.randn(2, 3, 16, 16)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"), torch.no_grad():
        out = torch.compile(model, backend="embedl_openvino")(x)
        expected = model(x)
    assert torch.equal(out, expected)  # not the folded conv: Dynamo's graph
    (subgraph,) = last_report().subgraphs
    assert subgraph.runtime == "eager" and subgraph.plan is None
    assert subgraph.reason == "no runtime of target 'openvino' is installed"
    assert [r.levelname for r in caplog.records] == ["WARNING"]
