"""SmoothQuant LayerNorm -> Linear migration: match, no-match reasons, exactness in float."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import quantize
from embedl_dynamo.graph.canonicalize import canonicalize
from embedl_dynamo.quant.int8.smooth import SmoothLayerNormLinear, apply_smoothing, smoothing_scales
from embedl_dynamo.rewrite.matcher import find_matches
from embedl_dynamo.transform import trace
from tests.models import ViTLike


class _LNLinear(nn.Module):
    def __init__(self, affine=True):
        super().__init__()
        self.ln = nn.LayerNorm(16, elementwise_affine=affine)
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(self.ln(x))


def _outlier_model(affine=True):
    torch.manual_seed(0)
    model = _LNLinear(affine).eval()
    if affine:
        with torch.no_grad():
            model.ln.weight.uniform_(0.5, 1.5)
            model.ln.weight[3] = 20.0  # an outlier channel
            model.ln.bias.uniform_(-0.5, 0.5)
    return model


def _graph(model, x):
    gm = trace(model, (x,))
    canonicalize(gm)
    return gm


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.8, 1.0])
def test_smoothing_is_exact_in_float_and_shrinks_the_outlier(alpha):
    model = _outlier_model()
    x = torch.randn(4, 10, 16)
    gm = _graph(model, x)
    ln = next(n for n in gm.graph.nodes if n.target is torch.nn.functional.layer_norm)
    before = torch.nn.functional.layer_norm(x, (16,), model.ln.weight, model.ln.bias).abs()
    done = apply_smoothing(gm, [SmoothLayerNormLinear(alpha)], [(x,)])
    assert done == ["smooth_layernorm_linear@fc"]
    torch.testing.assert_close(gm(x), model(x), atol=1e-5, rtol=1e-5)
    gamma = gm.get_submodule("").get_buffer(ln.kwargs["weight"].target)
    after = torch.nn.functional.layer_norm(x, (16,), gamma, gm.get_buffer(ln.kwargs["bias"].target))
    ratio_before = float(before.amax(dim=(0, 1)).max() / before.amax(dim=(0, 1)).median())
    ratio_after = float(after.abs().amax(dim=(0, 1)).max() / after.abs().amax(dim=(0, 1)).median())
    if alpha > 0:
        assert ratio_after < ratio_before  # the outlier channel moved into the weight


def test_no_match_reasons():
    x = torch.randn(2, 16)
    gm = _graph(_outlier_model(affine=False), x)
    pattern = SmoothLayerNormLinear()
    (m,) = find_matches(pattern, gm)
    assert pattern.check(m).reason == "LayerNorm has no affine weight and bias to absorb the scales"
    assert apply_smoothing(gm, [pattern], [(x,)]) == []
    with pytest.raises(ValueError, match="alpha must be in"):
        SmoothLayerNormLinear(1.5)


def test_scales_formula():
    act = torch.tensor([4.0, 1.0])
    weight = torch.tensor([[1.0, 2.0], [0.5, 1.0]])
    s = smoothing_scales(act, weight, 0.5)
    torch.testing.assert_close(s, torch.tensor([4.0**0.5 / 1.0**0.5, 1.0 / 2.0**0.5]).double())


def test_tensorrt_smooths_fused_transformer_blocks():
    torch.manual_seed(0)
    model = ViTLike().eval()
    x = torch.randn(2, 3, 16, 16)
    data = [torch.randn(2, 3, 16, 16) for _ in range(2)]
    float_ref = quantize(model, (x,), calibration_data=data, backend="tensorrt")
    smoothed = float_ref.meta["embedl_quantization"]["smoothed"]
    assert any(s.endswith("norm2") for s in smoothed)
