"""export_onnx: one file, weights as initializers, dynamic batch, clear errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import fx, nn

from embedl_dynamo.backends.tensorrt import BACKEND
from embedl_dynamo.errors import ExportError
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.weight_recorder import record_weights
from embedl_dynamo.graph.weight_tensors import graph_weights
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.pipeline import run_pipeline
from tests.models import ResNetLike, randomize_batchnorm


@pytest.fixture(scope="module")
def fused():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    return model, run_pipeline(capture(model, (x,)), [x], BACKEND).model, x


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_export_fused_graph_single_file_dynamic_batch(fused, tmp_path, exporter):
    model, gm, x = fused
    path = export_onnx(gm, [x], tmp_path / "m.onnx", exporter=exporter)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no external data
    proto = onnx.load(str(path))
    assert len(proto.graph.input) == 1 and len(proto.graph.initializer) > 0
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (2, 5):
        xb = torch.randn(batch, 3, 16, 16)
        (out,) = session.run(None, {"input_0": xb.numpy()})
        np.testing.assert_allclose(out, model(xb).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_export_under_the_weight_recorder_computes_from_its_inputs(fused, tmp_path):
    """A build runs its pipeline under the refit's weight recorder (a TorchDispatchMode), and
    ``mixed`` exports its candidates there: the TorchScript tracer took what the mode returned
    as constants, one ``Constant`` node right on the example input alone, which was cached and
    served. The exporters run outside any dispatch mode."""
    model, gm, x = fused
    with record_weights(graph_weights(gm)):
        path = export_onnx(gm, [x], tmp_path / "m.onnx", exporter="torchscript")
    assert "Conv" in {node.op_type for node in onnx.load(str(path)).graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    other = torch.randn(2, 3, 16, 16)
    (out,) = session.run(None, {"input_0": other.numpy()})
    np.testing.assert_allclose(out, model(other).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_static_export(fused, tmp_path):
    _, gm, x = fused
    proto = onnx.load(str(export_onnx(gm, [x], tmp_path / "s.onnx", dynamic_batch=False)))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_unsupported_op_names_the_op(tmp_path):
    class M(nn.Module):
        def forward(self, x):
            return (torch.cummax(x, 1).values,)

    with pytest.raises(ExportError, match="aten::cummax"):
        export_onnx(
            fx.symbolic_trace(M()), [torch.rand(2, 3)], tmp_path / "u.onnx", exporter="torchscript"
        )


def test_non_tensor_output_is_refused(tmp_path):
    class M(nn.Module):
        def forward(self, x):
            return (x * 2, 3)

    with pytest.raises(ExportError, match="output 1 is a int, not a tensor"):
        export_onnx(fx.symbolic_trace(M()), [torch.rand(2, 3)], tmp_path / "u.onnx")


def test_bad_exporter_name(fused, tmp_path):
    _, gm, x = fused
    with pytest.raises(ValueError, match="valid values: auto, torchscript, dynamo"):
        export_onnx(gm, [x], tmp_path / "m.onnx", exporter="tvm")


def test_failed_export_prints_no_graph_and_logs_one_line(tmp_path, capfd, caplog):
    """Regression (issue 12 item 17): the TorchScript exporter wrote a ~170-line IR graph to
    stderr on failure. The error names the op in one line; the native output goes to DEBUG."""
    gm = fx.symbolic_trace(_Bessel())
    with caplog.at_level("DEBUG", logger="embedl_dynamo.onnx.export"):
        with pytest.raises(ExportError, match="special_bessel_j0") as info:
            export_onnx(gm, [torch.randn(1, 4)], tmp_path / "m.onnx", exporter="torchscript")
    err = capfd.readouterr().err
    assert "Torch IR graph" not in err and "graph(" not in err
    assert "\n" not in str(info.value)
    assert any("Torch IR graph" in r.getMessage() for r in caplog.records if r.levelname == "DEBUG")


class _Bessel(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x).relu() + 1
