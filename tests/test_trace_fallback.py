"""``transform.trace`` falls back to Dynamo capture for models symbolic_trace cannot follow."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo as ed
from embedl_dynamo.backends.tensorrt import BACKEND
from tests.models import randomize_batchnorm

pytestmark = pytest.mark.usefixtures("compile_isolation")


class _ShapeBranch(nn.Module):
    """Python control flow on a shape: fx cannot trace it, Dynamo specialises on it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if x.shape[-1] > 4:
            y = y * 2
        return y


def test_transform_without_args_still_reports_the_fx_error():
    with pytest.raises(torch.fx.proxy.TraceError):
        ed.transform(_ShapeBranch().eval(), patterns=BACKEND.patterns)


def test_transform_with_args_uses_dynamo_capture():
    model = randomize_batchnorm(_ShapeBranch().eval())
    x = torch.randn(2, 3, 8, 8)
    result = ed.transform(model, args=(x,), patterns=BACKEND.patterns)
    assert "conv_bn_relu@conv" in [e.id for e in result.plan.entries if e.applied or e.apply]
    with torch.no_grad():
        torch.testing.assert_close(result.model(x)[0], model(x), rtol=1e-5, atol=1e-5)
