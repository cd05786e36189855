"""Linear fusions of the ``tensorrt`` target: match, no-match with its reason, numeric equality."""

from __future__ import annotations

import expecttest
import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo import get_transformation_plan, transform
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.patterns.fused_modules import FusedLinear
from embedl_dynamo.patterns.linear import LINEAR_PATTERNS, LINEAR_RELU
from embedl_dynamo.rewrite.qdq import Role
from tests.helpers import assert_same_outputs

X = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0))


class MLP(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = act
        self.fc2 = nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize(
    ("act", "name", "fused_act"),
    [
        (nn.ReLU(), "linear_relu", "relu"),
        (nn.GELU(), "linear_gelu", "gelu"),
        (nn.GELU(approximate="tanh"), "linear_gelu", "gelu_tanh"),
        (nn.SiLU(), "linear_silu", "silu"),
        (nn.Hardswish(), "linear_hardswish", "hardswish"),
    ],
)
def test_linear_activation_fuses(act: nn.Module, name: str, fused_act: str) -> None:
    model = MLP(act).eval()
    result = transform(model, (X,), LINEAR_PATTERNS)
    assert result.plan[f"{name}@fc1"].apply
    assert result.plan["linear@fc1"].reason == f"overlaps {name}@fc1"
    assert result.plan["linear@fc2"].apply
    fused = [m for m in result.model.modules() if isinstance(m, FusedLinear)]
    assert [(m.kind, m.activation) for m in fused] == [(name, fused_act), ("linear", None)]
    assert_same_outputs(model, result.model, X)


def test_linear_relu_spellings_fuse() -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(x).relu() + F.relu(self.fc(x * 2))

    model = Functional().eval()
    result = transform(model, (X,), [LINEAR_RELU])
    assert [e.id for e in result.plan.entries if e.apply] == ["linear_relu@fc", "linear_relu@fc#2"]
    assert_same_outputs(model, result.model, X)


def test_non_constant_linear_weight_is_not_fused() -> None:
    def fn(x, w):
        return torch.relu(F.linear(x, w))

    plan = get_transformation_plan(fx.symbolic_trace(fn), LINEAR_PATTERNS)
    reasons = {e.pattern.name: e.reason for e in plan.entries}
    assert reasons == {
        "linear_relu": "linear weight is not a constant",
        "linear": "linear weight is not a constant",
    }


def test_escaping_linear_output_is_not_fused() -> None:
    class Escape(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            y = self.fc(x)
            return torch.relu(y) * y

    model = Escape().eval()
    result = transform(model, (X,), LINEAR_PATTERNS)
    assert (
        result.plan["linear_relu@fc"].reason
        == "intermediate value linear is used outside the match"
    )
    assert result.plan["linear@fc"].apply
    assert_same_outputs(model, result.model, X)


def test_linear_qdq_declares_input_and_per_channel_weight() -> None:
    assert LINEAR_RELU.qdq.inputs == {"x": Role.ACTIVATION}
    assert LINEAR_RELU.qdq.weights == {"w": Role.WEIGHT}
    assert FusedLinear.qdq.inputs == {"0": Role.ACTIVATION}
    assert FusedLinear.qdq.weights == {"weight": Role.WEIGHT}


class Snapshots(expecttest.TestCase):
    def test_mlp_graph(self) -> None:
        result = transform(MLP(nn.GELU()).eval(), (X,), LINEAR_PATTERNS)
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
linear_gelu_fc1 = FusedLinear[gelu](x)
linear_fc2 = FusedLinear(linear_gelu_fc1)
return linear_fc2""",
        )
