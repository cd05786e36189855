"""Conversions of the ``tensorrt`` target: flatten_linear, remove_dropout, remove_identity."""

from __future__ import annotations

import expecttest
import torch
import torch.nn.functional as F
from torch import nn

from embedl_dynamo import get_transformation_plan, transform
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.patterns.conversions import (
    CONVERSION_PATTERNS,
    AddmmLinear,
    FlattenLinear,
    RemoveDropout,
    RemoveIdentity,
)
from tests.helpers import assert_same_outputs

G = torch.Generator().manual_seed(0)


class PoolHead(nn.Module):
    def __init__(self, pool: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(pool)
        self.fc = nn.Linear(8 * pool * pool, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.conv(x)), 1))


X = torch.randn(2, 3, 8, 8, generator=G)


class TestFlattenLinear(expecttest.TestCase):
    def test_match_becomes_conv1x1_then_flatten(self) -> None:
        model = PoolHead().eval()
        result = transform(model, (X,), [FlattenLinear()])
        entry = result.plan["flatten_linear@fc"]
        assert entry.applied and entry.reason == ""
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
conv2d = conv2d(input=x, weight=$conv.weight, bias=$conv.bias)
adaptive_avg_pool2d = adaptive_avg_pool2d(input=conv2d)
conv2d_1 = conv2d(input=adaptive_avg_pool2d, weight=$_const_fc_weight, bias=$fc.bias)
flatten_2 = flatten(input=conv2d_1)
return flatten_2""",
        )
        assert result.model._const_fc_weight.shape == (5, 8, 1, 1)
        assert_same_outputs(model, result.model, X)

    def test_view_spelling_matches_too(self) -> None:
        class ViewHead(PoolHead):
            def forward(self, x):
                y = self.pool(self.conv(x))
                return self.fc(y.view(y.size(0), -1))

        model = ViewHead().eval()
        result = transform(model, (X,), [FlattenLinear()])
        assert result.plan["flatten_linear@fc"].applied
        assert_same_outputs(model, result.model, X)

    def test_no_match_when_spatial_size_is_not_one(self) -> None:
        model = PoolHead(pool=2).eval()
        plan = get_transformation_plan(model, [FlattenLinear()], args=(X,))
        entry = plan["flatten_linear@fc"]
        assert not entry.apply and not entry.applied
        assert entry.reason == "flatten input is not N,C,1,1 (shape (2, 8, 2, 2))"

    def test_no_match_without_shapes(self) -> None:
        plan = get_transformation_plan(PoolHead().eval(), [FlattenLinear()])
        assert plan["flatten_linear@fc"].reason == (
            "flatten input shape is unknown (trace with example inputs)"
        )

    def test_user_model_is_not_modified(self) -> None:
        model = PoolHead().eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        transform(model, (X,), [FlattenLinear()])
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert isinstance(model.fc, nn.Linear)


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(self.drop(self.fc(x)), 0.2, training=False)
        return self.out(y.contiguous()).relu()


class TestRemoveDropoutAndIdentity(expecttest.TestCase):
    def test_eval_dropout_and_identities_are_removed(self) -> None:
        model = DropoutNet().eval()
        x = torch.randn(4, 6, generator=G)
        result = transform(model, (x,), CONVERSION_PATTERNS)
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
linear = linear(input=x, weight=$fc.weight, bias=$fc.bias)
contiguous_1 = contiguous(input=linear)
relu_1 = relu(input=contiguous_1)
return relu_1""",
        )
        applied = sorted(e.id for e in result.plan.entries if e.applied)
        # functional calls at the root are named by their node; contiguous() is not an identity
        assert applied == ["remove_dropout@drop", "remove_dropout@dropout_2", "remove_identity@out"]
        assert_same_outputs(model, result.model, x)

    def test_training_dropout_is_kept_with_reason(self) -> None:
        model = DropoutNet().train()
        plan = get_transformation_plan(model, [RemoveDropout()], args=(torch.randn(4, 6),))
        entry = plan["remove_dropout@drop"]
        assert not entry.applied
        assert entry.reason == "dropout is in training mode (call model.eval())"
        assert any(n.target is F.dropout for n in plan.model.graph.nodes)

    def test_identity_reading_a_graph_input(self) -> None:
        class Only(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.same = nn.Identity()

            def forward(self, x):
                return nn.functional.relu(self.same(x))

        x = torch.randn(3, generator=G)
        result = transform(Only(), (x,), [RemoveIdentity()])
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
relu_1 = relu(input=x)
return relu_1""",
        )
        assert torch.equal(result.model(x), torch.relu(x))


class ChannelShuffle(nn.Module):
    """ShuffleNetV2's channel shuffle: the view after transpose needs contiguous()."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return y.view(b, c, h, w)


def test_contiguous_is_kept_because_a_later_view_needs_it() -> None:
    x = torch.randn(2, 4, 3, 3, generator=G)
    result = transform(ChannelShuffle(), (x,), CONVERSION_PATTERNS)
    assert not any(e.pattern.name == "remove_identity" for e in result.plan.entries)
    assert_same_outputs(ChannelShuffle(), result.model, x)


class Conv1DLike(nn.Module):
    """HF's ``Conv1D``: ``addmm(bias, x.view(-1, in), weight)`` with a ``(in, out)`` weight."""

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, generator=G))
        self.bias = nn.Parameter(torch.randn(4, generator=G))
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, 6), self.weight, beta=self.beta)
        return out.view(*x.shape[:-1], 4)


TOKENS = torch.randn(2, 5, 6, generator=G)


class TestAddmmLinear(expecttest.TestCase):
    def test_match_becomes_a_linear_with_the_transposed_weight(self) -> None:
        model = Conv1DLike().eval()
        result = transform(model, (TOKENS,), [AddmmLinear()])
        (entry,) = [e for e in result.plan.entries if e.pattern.name == "addmm_linear"]
        assert entry.applied and entry.reason == ""
        self.assertIn("linear(input=", format_graph(result.model))
        self.assertNotIn("= addmm(", format_graph(result.model))
        assert result.model._const_addmm_weight.shape == (4, 6)
        assert_same_outputs(model, result.model, TOKENS)

    def test_no_match_when_beta_is_not_one(self) -> None:
        plan = get_transformation_plan(Conv1DLike(beta=0.5).eval(), [AddmmLinear()], (TOKENS,))
        (entry,) = plan.entries
        assert not entry.apply and entry.reason == "addmm with beta or alpha != 1"

    def test_no_match_when_the_weight_is_an_input(self) -> None:
        class Runtime(nn.Module):
            def forward(self, x, w, b):
                return torch.addmm(b, x, w)

        args = (torch.randn(3, 6), torch.randn(6, 4), torch.randn(4))
        plan = get_transformation_plan(Runtime(), [AddmmLinear()], args)
        (entry,) = plan.entries
        assert not entry.apply and entry.reason == "addmm weight or bias is not a constant"
