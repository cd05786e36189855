"""Our lowered ONNX file runs the same layers on OpenVINO's CPU plugin as OpenVINO's own
conversion of the same PyTorch model: nothing unfused, no extra layout reorders."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.onnx import export as onnx_export
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.models import MobileNetLike, ResNetLike

pytestmark = [
    pytest.mark.skipif(not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"),
    # ov.convert_model traces with torch.jit, which warns that it is deprecated
    pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning"),
]

_NOT_WORK = {"Input", "Output", "Const", "Reshape"}  # graph ends, weights, in-place views


def _executed(compiled: Any) -> Counter[tuple[str, str]]:
    """``(layer type, kernel) -> count`` over the CPU plugin's runtime model."""
    counts: Counter[tuple[str, str]] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str)
        if kind not in _NOT_WORK:
            counts[(kind, info["primitiveType"].astype(str))] += 1
    return counts


def _both_sides(model: torch.nn.Module, tmp_path, lowering: bool) -> tuple[Counter, Counter]:
    import openvino as ov

    from embedl_dynamo.runtimes.openvino.compile import compile_openvino

    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    path = embedl_dynamo.export(
        model, (x,), tmp_path / "model.onnx", backend="openvino", precision="fp32", verify=False
    )
    core = ov.Core()
    if lowering:
        ours = compile_openvino(path, 1)
    else:  # the file as OpenVINO's ONNX frontend reads it
        ours = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    with torch.no_grad():
        theirs = ov.convert_model(model, example_input=(x,))
    theirs = core.compile_model(theirs, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return _executed(ours), _executed(theirs)


def _classifier_free(counts: Counter) -> Counter:
    """The counts without the classifier: our export runs a linear on a pooled 1x1 map as a 1x1
    convolution (``flatten_linear``), OpenVINO's conversion as a FullyConnected."""
    return Counter(
        {k: v for k, v in counts.items() if k[0] not in ("Convolution", "FullyConnected")}
    )


@pytest.mark.parametrize(
    "model_class", [pytest.param(MobileNetLike, marks=pytest.mark.slow), ResNetLike]
)
def test_lowered_file_runs_the_layers_of_openvinos_own_conversion(
    model_class, tmp_path, monkeypatch
):
    # the layers the lowering gives, less the exact forms that OpenVINO's own conversion does
    # not have (a max pool's NaN windows: graph/exact_ops.py)
    monkeypatch.setattr(onnx_export, "exact_lowering", lambda gm: gm)
    ours, theirs = _both_sides(model_class().eval(), tmp_path, lowering=True)
    only_ours = {kind for kind, _ in ours} - {kind for kind, _ in theirs}
    assert not only_ours, f"layer types OpenVINO's own conversion does not run: {only_ours}"
    assert _classifier_free(ours) == _classifier_free(theirs)
    # the linear layers: the same number of matrix layers on each side
    matrix = ("Convolution", "FullyConnected")
    assert sum(v for k, v in ours.items() if k[0] in matrix) == sum(
        v for k, v in theirs.items() if k[0] in matrix
    )


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_without_the_lowering_the_squeeze_excite_gate_runs_unfused(tmp_path):
    # the regression the lowering closes: HardSigmoid as a reference-kernel Math layer, with
    # layout reorders around it, where OpenVINO's own conversion fuses it into the conv
    ours, theirs = _both_sides(MobileNetLike().eval(), tmp_path, lowering=False)
    assert ours[("Math", "ref_any_f32")] > 0
    assert ("Math", "ref_any_f32") not in theirs
    reorders = sum(v for k, v in ours.items() if k[0] == "Reorder")
    assert reorders > sum(v for k, v in theirs.items() if k[0] == "Reorder")


@pytest.mark.parametrize("fn", [lambda x: x.expand(()).clone(), lambda x: x.expand_as(x) * 1])
def test_a_0d_tensor_expanded_to_rank_0_compiles(fn):
    """Regression: the exporter's form of this no-op (Expand to the shape of an empty
    ConstantOfShape) crashed OpenVINO's compile_model with a segmentation fault."""
    torch._dynamo.reset()
    options = {"runtime": "openvino", "min_subgraph_size": 1, "fallback": "raise"}
    x = torch.tensor(3.0)
    out = torch.compile(fn, backend="embedl_openvino", options=options, dynamic=False)(x)
    assert torch.equal(out, fn(x))
    assert embedl_dynamo.last_report().subgraphs[0].runtime == "openvino"
