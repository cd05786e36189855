"""``precision="fp8"`` end to end: options, the environment, ``export()``, the CLI, and its
accuracy beside INT8's on real data (scikit-learn digits: a trained CNN, a ViT) and a small
decoder."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper
from torch import nn

import embedl_dynamo
from embedl_dynamo.cli import EXIT_OK, main
from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt
from embedl_dynamo.settings import ENV_PRECISION, Settings
from tests.digits import DigitsViT, load_digits_tensors

_QDQ = ("QuantizeLinear", "DequantizeLinear")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.conv = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(F.relu(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def _fp8_file_facts(path) -> dict:
    model = onnx.load(str(path))
    consts = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = node.attribute[0].t
    qdq = [n for n in model.graph.node if n.op_type in _QDQ]
    return {
        "opset": model.opset_import[0].version,
        "zero_types": {consts[n.input[2]].data_type for n in qdq},
        "zeros": {
            float(numpy_helper.to_array(consts[n.input[2]]).astype(np.float32).max()) for n in qdq
        },
        "weight_types": {consts[n.input[0]].data_type for n in qdq if n.input[0] in consts},
        "quantize_of_constant": [
            n.name for n in qdq if n.op_type == "QuantizeLinear" and n.input[0] in consts
        ],
    }


def test_export_fp8_writes_the_file_for_tensorrt(tmp_path):
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 16, 16)
    data = [torch.randn(4, 3, 16, 16) for _ in range(3)]
    path = embedl_dynamo.export(
        model,
        x,
        tmp_path / "m.onnx",
        precision="fp8",
        calibration_data=data,
        options={"cache_dir": str(tmp_path / "c")},
    )
    facts = _fp8_file_facts(path)
    assert facts["opset"] >= 19
    assert facts["zero_types"] == {TensorProto.FLOAT8E4M3FN} and facts["zeros"] == {0.0}
    assert facts["weight_types"] == {TensorProto.FLOAT8E4M3FN}  # FP8 initializers, DQ only
    assert facts["quantize_of_constant"] == []
    assert lint_for_tensorrt(onnx.load(str(path))) == []
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["precision"] == "fp8" and side["verification"]["passed"]
    assert side["verification"]["max_abs_diff"] < 1e-4  # the file computes the fake-quant graph
    layers = {r["id"]: r["precision"] for r in side["layers"]}
    assert layers == {"quant_conv@conv": "fp8", "quant_linear@fc": "fp8", "quant_conv@stem": "fp32"}
    reasons = {f["id"]: f["reason"] for f in side["quantization"]["float_layers"]}
    assert "not both above 16" in reasons["quant_conv@stem"]


def test_the_compile_report_shows_fp8_layers(tmp_path):
    from embedl_dynamo.report.html import layer_rows

    torch.manual_seed(0)
    model = _Net().eval()
    options = {
        "precision": "fp8",
        "calibration_data": [torch.randn(2, 3, 16, 16)],
        "cache_dir": str(tmp_path),
        "runtime": "onnxruntime",
        "fallback": "raise",
    }
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        compiled(torch.randn(2, 3, 16, 16))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime" and "fp8 (2 fp8, 1 fp32 layers)" in str(
        embedl_dynamo.last_report()
    )
    rows = {r["id"]: r["precision"] for r in layer_rows(sub)}
    assert rows["conv_relu@conv"] == "fp8" and rows["conv_relu@stem"] == "fp32", rows


def test_fp8_is_accepted_from_options_the_environment_and_the_cli(tmp_path, monkeypatch):
    assert Settings.from_options({"precision": "fp8"}).precision.name == "fp8"
    monkeypatch.setenv(ENV_PRECISION, "fp8")
    assert Settings.from_options({}).precision.name == "fp8"
    monkeypatch.delenv(ENV_PRECISION)
    net = tmp_path / "net.py"
    net.write_text(
        "import torch\nfrom tests.quant.test_fp8_export import _Net\n"
        "def build():\n    torch.manual_seed(0)\n    return _Net()\n"
    )
    out = tmp_path / "cli.onnx"
    argv = [
        "export",
        f"{net}:build",
        "--input-shape",
        "2,3,16,16",
        "-o",
        str(out),
        "--precision",
        "fp8",
        "--cache-dir",
        str(tmp_path / "cache"),
        "-q",
    ]
    assert main(argv) == EXIT_OK
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["precision"] == "fp8" and side["quantized"] is True
    assert _fp8_file_facts(out)["zero_types"] == {TensorProto.FLOAT8E4M3FN}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def _file_cosines(model, x, calibration, tmp_path, precisions=("int8", "fp8")) -> dict:
    """Each precision's exported file (run on ONNX Runtime) against the float model."""
    from embedl_dynamo.runtimes.onnxruntime.session import create_session

    with torch.no_grad():
        expected = model(x)
    cosines = {}
    for precision in precisions:
        path = embedl_dynamo.export(
            model,
            x,
            tmp_path / f"{precision}.onnx",
            precision=precision,
            calibration_data=calibration,
            options={"cache_dir": str(tmp_path / "c")},
        )
        session = create_session(str(path))
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (x,))}
        out = torch.from_numpy(session.run(None, feeds)[0])
        cosines[precision] = _cosine(out, expected)
    return cosines


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fp8_keeps_the_digits_cnn_within_budget(digits, tmp_path):
    model, (x_train, _, x_test, _) = digits
    cos = _file_cosines(model, x_test[:256], list(x_train[:256].split(64)), tmp_path)
    budget = Settings().accuracy_budget
    assert cos["fp8"] >= budget and cos["int8"] >= budget, cos


@pytest.mark.slow  # about 8 s; attention in FP8 by default: test_fp8_keeps_a_small_decoder_within_budget
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fp8_keeps_the_digits_vit_within_budget(tmp_path):
    torch.manual_seed(0)
    model = DigitsViT().eval()  # untrained (training it costs seconds), on the digits
    x_train, _, x_test, _ = load_digits_tensors()
    cos = _file_cosines(model, x_test[:256], list(x_train[:256].split(64)), tmp_path)
    assert cos["fp8"] >= Settings().accuracy_budget, cos


class _TinyDecoder(nn.Module):
    """Token embedding, two pre-norm causal self-attention blocks (SDPA), an LM head."""

    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * depth))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, t, d = x.shape
        for i, (qkv, out, mlp) in enumerate(zip(self.qkv, self.out, self.mlp)):
            q, k, v = qkv(self.norms[2 * i](x)).split(d, dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + out(a.transpose(1, 2).reshape(b, t, d))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(x)


@pytest.mark.slow  # in CI's slow slice; FP8's export and lint run by default
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fp8_keeps_a_small_decoder_within_budget(tmp_path):
    torch.manual_seed(0)
    model = _TinyDecoder().eval()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (4, 32), generator=gen)
    calibration = [torch.randint(0, 64, (4, 32), generator=gen) for _ in range(4)]
    cos = _file_cosines(model, tokens, calibration, tmp_path)
    assert cos["fp8"] >= Settings().accuracy_budget, cos
