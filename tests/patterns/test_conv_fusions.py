"""Conv fusions of the ``tensorrt`` target: match, no-match with its reason, numeric equality."""

from __future__ import annotations

import expecttest
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedl_dynamo import get_transformation_plan, transform
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.patterns.conv import CONV_PATTERNS
from embedl_dynamo.patterns.conv_bn import CONV_BN_PATTERNS
from embedl_dynamo.patterns.fused_modules import FusedConv, FusedConvAdd, FusedConvMaxPool
from embedl_dynamo.patterns.pooling import POOLING_PATTERNS
from embedl_dynamo.patterns.residual import RESIDUAL_PATTERNS
from embedl_dynamo.rewrite.qdq import Role
from tests.helpers import assert_same_outputs, plan_table
from tests.models import SqueezeExcite, randomize_batchnorm

ALL = (*POOLING_PATTERNS, *RESIDUAL_PATTERNS, *CONV_BN_PATTERNS, *CONV_PATTERNS)
X = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(0))


class ConvBNAct(nn.Module):
    def __init__(self, act: nn.Module, bias: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(8)
        self.act = act
        randomize_batchnorm(self)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


@pytest.mark.parametrize(
    ("act", "name"),
    [
        (nn.ReLU(), "conv_bn_relu"),
        (nn.ReLU(inplace=True), "conv_bn_relu"),
        (nn.ReLU6(), "conv_bn_relu6"),
        (nn.SiLU(), "conv_bn_silu"),
        (nn.Hardswish(), "conv_bn_hardswish"),
        (nn.GELU(), "conv_bn_gelu"),
        (nn.GELU(approximate="tanh"), "conv_bn_gelu"),
    ],
)
def test_conv_bn_activation_fuses(act: nn.Module, name: str) -> None:
    model = ConvBNAct(act, bias=True).eval()
    result = transform(model, (X,), ALL)
    assert result.plan[f"{name}@conv"].apply
    fused = [m for m in result.model.modules() if isinstance(m, FusedConv)]
    assert len(fused) == 1 and fused[0].kind == name
    assert not any(n.target is F.batch_norm for n in result.model.graph.nodes)
    assert_same_outputs(model, result.model, X)


def test_conv_bn_training_mode_is_not_fused() -> None:
    plan = get_transformation_plan(ConvBNAct(nn.ReLU()).train(), ALL, (X,))
    assert plan["conv_bn_relu@conv"].reason == "BatchNorm is in training mode (call model.eval())"
    assert plan["conv_bn@conv"].reason == "BatchNorm is in training mode (call model.eval())"
    assert plan["conv@conv"].apply  # the convolution alone still fuses


def test_conv_bn_escaping_bn_output_is_not_fused() -> None:
    class Escape(ConvBNAct):
        def forward(self, x):
            y = self.bn(self.conv(x))
            return self.act(y) + y

    model = Escape(nn.SiLU()).eval()
    plan = get_transformation_plan(model, ALL, (X,))
    assert plan["conv_bn_silu@conv"].reason.startswith("intermediate value batch_norm")
    assert plan["conv_bn@conv"].apply


def test_non_constant_conv_weight_is_not_fused() -> None:
    def fn(x, w):
        return torch.relu(F.conv2d(x, w))

    from torch import fx

    plan = get_transformation_plan(fx.symbolic_trace(fn), ALL)
    (entry,) = plan.select("conv_relu@*")
    assert entry.reason == "convolution weight is not a constant"


class Stem(nn.Module):
    def __init__(self, return_indices: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1, return_indices=return_indices)
        randomize_batchnorm(self)

    def forward(self, x):
        y = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return y[0] if isinstance(y, tuple) else y


def test_stem_fuses_and_overlaps_shorter_matches() -> None:
    model = Stem().eval()
    result = transform(model, (X,), ALL)
    plan = result.plan
    assert plan["stem_conv_bn_relu_maxpool@conv1"].apply
    assert plan["conv_bn_relu@conv1"].reason == "overlaps stem_conv_bn_relu_maxpool@conv1"
    assert plan["conv_bn@conv1"].reason == "overlaps stem_conv_bn_relu_maxpool@conv1"
    (fused,) = [m for m in result.model.modules() if isinstance(m, FusedConv)]
    assert isinstance(fused, FusedConvMaxPool) and fused.pool["kernel_size"] == 3
    assert_same_outputs(model, result.model, X)


def test_stem_with_indices_is_not_fused() -> None:
    model = Stem(return_indices=True).eval()
    plan = get_transformation_plan(model, ALL, (X,))
    assert plan["stem_conv_bn_relu_maxpool@conv1"].reason == "max pool returns indices"
    assert plan["conv_bn_relu@conv1"].apply


class Residual(nn.Module):
    def __init__(self, spelling: str, relu: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.spelling, self.relu = spelling, relu
        randomize_batchnorm(self)

    def forward(self, x):
        identity = x * 0.5
        out = self.bn(self.conv(x))
        if self.spelling == "bn+r":
            out = out + identity
        elif self.spelling == "r+bn":
            out = identity + out
        elif self.spelling == "iadd":
            out += identity
        elif self.spelling == "torch.add":
            out = torch.add(identity, out)
        else:  # broadcast: a per-channel residual
            out = out + identity.mean(dim=(2, 3), keepdim=True)
        return F.relu(out) if self.relu else out


@pytest.mark.parametrize("spelling", ["bn+r", "r+bn", "iadd", "torch.add"])
def test_conv_bn_add_relu_fuses_either_operand_order(spelling: str) -> None:
    model = Residual(spelling).eval()
    result = transform(model, (X,), ALL)
    assert result.plan["conv_bn_add_relu@conv"].apply
    assert result.plan["conv_bn_add@conv"].reason == "overlaps conv_bn_add_relu@conv"
    (fused,) = [m for m in result.model.modules() if isinstance(m, FusedConv)]
    assert isinstance(fused, FusedConvAdd) and fused.activation == "relu"
    assert_same_outputs(model, result.model, X)


def test_conv_bn_add_without_relu_fuses() -> None:
    model = Residual("r+bn", relu=False).eval()
    result = transform(model, (X,), ALL)
    assert result.plan["conv_bn_add@conv"].apply
    (fused,) = [m for m in result.model.modules() if isinstance(m, FusedConv)]
    assert isinstance(fused, FusedConvAdd) and fused.activation is None
    assert_same_outputs(model, result.model, X)


def test_broadcast_residual_is_not_fused() -> None:
    plan = get_transformation_plan(Residual("broadcast").eval(), ALL, (X,))
    reason = plan["conv_bn_add_relu@conv"].reason
    assert reason == (
        "residual shape (2, 4, 1, 1) differs from the convolution output shape (2, 4, 12, 12) "
        "(a broadcasting add is not fused)"
    )
    assert plan["conv_bn@conv"].apply


def test_residual_qdq_quantizes_both_branches() -> None:
    from embedl_dynamo.patterns.residual import CONV_BN_ADD_RELU

    assert CONV_BN_ADD_RELU.qdq.inputs == {"x": Role.ACTIVATION, "residual": Role.ACTIVATION}
    assert CONV_BN_ADD_RELU.qdq.weights == {"w": Role.WEIGHT}
    assert FusedConvAdd.qdq.inputs == {"0": Role.ACTIVATION, "1": Role.ACTIVATION}
    assert FusedConv.qdq.weights == {"weight": Role.WEIGHT}


def test_squeeze_excite_convs_fuse_with_their_activation() -> None:
    model = SqueezeExcite(4, 2).eval()
    result = transform(model, (X,), ALL)
    plan = result.plan
    assert plan["conv_relu@fc1"].apply
    assert plan["conv_hardsigmoid@fc2"].apply
    assert plan["adaptive_avg_pool@pool"].apply
    assert plan["conv@fc1"].reason == "overlaps conv_relu@fc1"
    assert_same_outputs(model, result.model, X)


class Snapshots(expecttest.TestCase):
    def test_residual_graph(self) -> None:
        result = transform(Residual("iadd").eval(), (X,), ALL)
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
mul_1 = mul(input=x)
conv_bn_add_relu_conv = FusedConvAdd[relu](x, mul_1)
return conv_bn_add_relu_conv""",
        )

    def test_squeeze_excite_plan(self) -> None:
        plan = get_transformation_plan(SqueezeExcite(4, 2).eval(), ALL, (X,))
        self.assertExpectedInline(
            plan_table(plan),
            """\
id                      pattern            apply  reason
----------------------  -----------------  -----  -----------------------------
conv_relu@fc1           conv_relu          yes
conv_hardsigmoid@fc2    conv_hardsigmoid   yes
adaptive_avg_pool@pool  adaptive_avg_pool  yes
conv@fc1                conv               no     overlaps conv_relu@fc1
conv@fc2                conv               no     overlaps conv_hardsigmoid@fc2""",
        )
