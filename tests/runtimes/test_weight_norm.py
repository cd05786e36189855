"""``torch._weight_norm``, the op a weight-norm parametrization records (wav2vec2's positional
convolution: ``nn.utils.parametrizations.weight_norm(nn.Conv1d(...), dim=2)``): freezing keeps
it as an op on the two frozen weights, ``g * v / ||v||`` with the norm over every axis but
``dim`` (``dim=-1``, from ``dim=None``: over all of them), and the ONNX export folds it into the
convolution's weight. Its row (:mod:`embedl_dynamo.runtimes.conformance`) is checked here, as
OpInfo has no entry for it: on samples of each ``dim`` with the sweep's edge values
(:mod:`.conformance_edges`) in either weight, and by layers that use it running whole on the
runtime."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import differences, rule_for
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import assert_conforms, compile_on, placement
from tests.runtimes.conformance_edges import edge_calls

RUNTIMES = [
    "onnxruntime",
    pytest.param(
        "openvino",
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]
_G = torch.Generator().manual_seed(0)

# (v, g, dim): a convolution's weight per output channel (dim 0), wav2vec2's per kernel tap
# (dim 2), a linear layer's per input feature (dim 1) and over the whole weight (dim=-1)
SAMPLES = (
    (torch.randn(8, 4, 3, generator=_G), torch.rand(8, 1, 1, generator=_G) + 0.5, 0),
    (torch.randn(4, 2, 5, generator=_G), torch.rand(1, 1, 5, generator=_G) + 0.5, 2),
    (torch.randn(5, 6, generator=_G), torch.rand(1, 6, generator=_G) + 0.5, 1),
    (torch.randn(3, 4, generator=_G), torch.tensor(1.5), -1),
)


def _weight_norms(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    pairs = zip(tensors[::2], tensors[1::2], (dim for _, _, dim in SAMPLES))
    return tuple(torch._weight_norm(v, g, dim) for v, g, dim in pairs)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_weight_norm_conforms_on_samples_and_edge_values(runtime):
    """Every sample runs on the runtime as its row says, then the same graph on the samples
    refilled with NaN, +-inf, -0.0 and ties (in ``v`` and ``g`` at once), CI's positions."""
    tensors = [t for v, g, _ in SAMPLES for t in (v, g)]
    rule = rule_for("_weight_norm", runtime, torch.float32)
    compiled = compile_on(_weight_norms, runtime)
    assert_conforms(_weight_norms(*tensors), compiled(*tensors), rule.verdict, runtime)
    ran, kept = placement(last_report().subgraphs, runtime)
    assert ran and not kept, kept
    assert not differences("_weight_norm", runtime)  # none listed: every edge must conform
    for label, edge in edge_calls(tensors, torch.float32):
        assert_conforms(_weight_norms(*edge), compiled(*edge), rule.verdict, f"{runtime}, {label}")


class _PositionalConv(nn.Module):
    """wav2vec2's positional convolution: a grouped conv1d over time, weight-normed per
    kernel tap (``dim=2``), its last step dropped, GELU, added to its input."""

    def __init__(self, channels: int = 16, kernel: int = 8, groups: int = 4) -> None:
        super().__init__()
        conv = nn.Conv1d(channels, channels, kernel, padding=kernel // 2, groups=groups)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.transpose(1, 2))[:, :, :-1]
        return x + nn.functional.gelu(h).transpose(1, 2)


def _layers() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "wav2vec2_positional_conv": _PositionalConv(),
        "linear_weight_norm_dim_none": nn.utils.parametrizations.weight_norm(
            nn.Linear(16, 16), dim=None
        ),
    }


@pytest.mark.parametrize("layer", sorted(_layers()))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_weight_normed_layer_runs_fully_on_the_runtime(layer, runtime):
    """Before its row, ``_weight_norm`` kept the weight in PyTorch and the convolution read it
    as an input on every call."""
    model = _layers()[layer].eval()
    x = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = model(x)
        torch._dynamo.reset()
        actual = compile_on(model, runtime)(x)
    (report,) = last_report().subgraphs
    assert report.status == "compiled" and report.runtime == runtime, report.reason
    assert_conforms(expected, actual, rule_for("conv1d", runtime, torch.float32).verdict, layer)
