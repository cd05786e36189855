"""The pattern engine: canonicaliser, matcher and plan, on toy patterns and small models."""

from __future__ import annotations

import operator
import re

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo import (
    Match,
    Pattern,
    apply_transformation_plan,
    get_transformation_plan,
    trace,
    transform,
)
from embedl_dynamo.graph.canonicalize import canonicalize
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.fused_modules import FusedConv
from embedl_dynamo.rewrite.engine import MAX_CONVERSION_ROUNDS
from embedl_dynamo.rewrite.matcher import find_matches
from tests.helpers import dynamo_frozen
from tests.models import MobileNetLike, ResNetLike

X = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
IMAGE = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


class Relu(Pattern):
    name = "relu"
    phase = "fusion"

    @staticmethod
    def target(x):
        out = F.relu(x)
        return out, {"out": out}


class Add(Pattern):
    name = "add"
    phase = "fusion"

    @staticmethod
    def target(x, y):
        out = x + y
        return out, {"out": out}


class FlattenLinear(Pattern):
    name = "flatten_linear"
    phase = "fusion"

    @staticmethod
    def target(x, w, b):
        flat = torch.flatten(x, 1)
        out = F.linear(flat, w, b)
        return out, {"flat": flat, "out": out}


class SiLUByHand(Pattern):
    """``x * sigmoid(x)``: the same argument used twice, under a commutative op."""

    name = "silu_by_hand"
    phase = "fusion"

    @staticmethod
    def target(x):
        out = x * torch.sigmoid(x)
        return out, {"out": out}


def _matches(pattern: Pattern, fn, *args) -> list[Match]:
    model = fn if isinstance(fn, nn.Module) else (_Wrap if len(args) == 1 else _Wrap2)(fn)
    gm = canonicalize(trace(model, args))
    return find_matches(pattern, gm)


class _Wrap(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Wrap2(_Wrap):
    def forward(self, x, y):
        return self.fn(x, y)


def _relu_inplace(x):
    y = x * 1.0
    y.relu_()
    return y


@pytest.mark.parametrize(
    "fn",
    [
        F.relu,
        torch.relu,
        nn.ReLU(),
        nn.ReLU(inplace=True),
        lambda x: x.relu(),
        _relu_inplace,
        lambda x: F.relu(x, inplace=True),
    ],
    ids=["F.relu", "torch.relu", "nn.ReLU", "nn.ReLU(inplace)", "x.relu", "x.relu_", "F.relu_"],
)
def test_one_relu_pattern_covers_every_spelling(fn) -> None:
    (m,) = _matches(Relu(), fn, X)
    assert m["out"].target is torch.relu
    assert m["x"].op in ("placeholder", "call_function")


def test_inplace_relu_readers_see_the_new_value() -> None:
    class Inplace(nn.Module):
        def forward(self, x):
            y = x * 2.0
            z = y.relu_()
            return y + z  # both read the mutated value

    model = Inplace()
    gm = canonicalize(trace(model, (X,)))
    assert torch.equal(gm(X), model(X))
    (add,) = [n for n in gm.graph.nodes if n.target is torch.add]
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    assert add.kwargs["input"] is relu and add.kwargs["other"] is relu


def _iadd(x, y):
    z = x * 1.0
    z += y
    return z


@pytest.mark.parametrize(
    "fn",
    [operator.add, _iadd, torch.add, lambda x, y: x.add(y), lambda x, y: x.add_(y)],
    ids=["operator.add", "operator.iadd", "torch.add", "x.add", "x.add_"],
)
def test_one_add_pattern_covers_every_spelling(fn) -> None:
    (m,) = _matches(Add(), fn, X, X * 2)
    assert m["out"].target is torch.add


def test_add_with_alpha_is_not_an_add() -> None:
    assert _matches(Add(), lambda x, y: torch.add(x, y, alpha=2), X, X) == []


class _Head(nn.Module):
    def __init__(self, flatten) -> None:
        super().__init__()
        self.flatten = flatten
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(self.flatten(x))


@pytest.mark.parametrize(
    "flatten",
    [
        lambda x: torch.flatten(x, 1),
        nn.Flatten(),
        lambda x: x.flatten(1),
        lambda x: x.view(x.shape[0], -1),
        lambda x: x.reshape(2, -1),
        lambda x: torch.reshape(x, (2, 12)),
    ],
    ids=["torch.flatten", "nn.Flatten", "x.flatten", "view(n,-1)", "reshape", "torch.reshape"],
)
def test_one_flatten_pattern_covers_every_spelling(flatten) -> None:
    (m,) = _matches(FlattenLinear(), _Head(flatten), torch.randn(2, 3, 2, 2))
    assert m["flat"].kwargs["start_dim"] == 1


def test_view_that_is_not_a_flatten_does_not_match() -> None:
    head = _Head(lambda x: x.view(2, 3, 4)[:, 0])  # not a flatten: keeps three dimensions
    head.fc = nn.Linear(4, 3)
    assert _matches(FlattenLinear(), head, torch.randn(2, 3, 2, 2)) == []


@pytest.mark.parametrize(
    "fn",
    [lambda x: x * torch.sigmoid(x), lambda x: torch.sigmoid(x) * x, lambda x: x.mul(x.sigmoid())],
    ids=["x*sig(x)", "sig(x)*x", "x.mul"],
)
def test_commutative_matching_binds_both_orders(fn) -> None:
    (m,) = _matches(SiLUByHand(), fn, X)
    assert m["x"].op == "placeholder"


def test_repeated_argument_must_bind_the_same_value() -> None:
    assert _matches(SiLUByHand(), lambda x, y: x * torch.sigmoid(y), X, X) == []


def test_escaping_intermediate_value_is_the_reason() -> None:
    class Escape(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(12, 3)

        def forward(self, x):
            flat = torch.flatten(x, 1)
            return self.fc(flat), flat

    plan = get_transformation_plan(Escape(), [FlattenLinear()], (torch.randn(2, 3, 4),))
    (entry,) = plan.entries
    assert not entry.apply
    assert re.fullmatch(
        r"intermediate value flatten(_\d+)? is used outside the match", entry.reason
    )


def _resnet_plan():
    return get_transformation_plan(ResNetLike().eval(), COMMON_FUSION_PATTERNS, (IMAGE,))


def test_overlaps_name_the_longer_match() -> None:
    plan = _resnet_plan()
    assert plan["conv_bn_relu@layer1.0.conv1"].apply
    assert plan["conv_bn@layer1.0.conv1"].reason == "overlaps conv_bn_relu@layer1.0.conv1"
    assert plan["conv_bn@layer1.0.conv2"].reason == "overlaps conv_bn_add_relu@layer1.0.conv2"
    assert plan["conv@layer2.0.downsample.0"].reason == "overlaps conv_bn@layer2.0.downsample.0"
    for entry in plan.entries:  # every skip has a reason, every reason is a skip
        assert entry.apply == (entry.reason == "")


def test_disable_by_glob_makes_overlapped_matches_applicable() -> None:
    model = ResNetLike().eval()
    plan = get_transformation_plan(model, COMMON_FUSION_PATTERNS, (IMAGE,))
    disabled = plan.disable("conv_bn_relu@*layer1*")
    assert sorted(e.id for e in disabled) == [
        "conv_bn_relu@layer1.0.conv1",
        "conv_bn_relu@layer1.1.conv1",
    ]
    assert plan["conv_bn_relu@layer1.0.conv1"].reason == "disabled by user"
    assert plan["conv_bn@layer1.0.conv1"].apply and plan["conv_bn@layer1.0.conv1"].reason == ""
    assert plan["conv_bn@layer2.0.conv1"].reason == "overlaps conv_bn_relu@layer2.0.conv1"
    result = apply_transformation_plan(plan)
    kinds = {m.kind for m in result.model.modules() if isinstance(m, FusedConv)}
    assert "conv_bn" in kinds
    with torch.no_grad():
        assert (result.model(IMAGE) - model(IMAGE)).abs().max().item() <= 1e-5
    plan.enable("conv_bn_relu@layer1.0.conv1")
    assert plan["conv_bn@layer1.0.conv1"].reason == "overlaps conv_bn_relu@layer1.0.conv1"


def test_toggle_errors_are_clear() -> None:
    plan = _resnet_plan()
    with pytest.raises(KeyError, match="no pending match id matches 'nothing@\\*'"):
        plan.disable("nothing@*")
    with pytest.raises(KeyError, match="known ids include: stem_conv_bn_relu_maxpool@conv1"):
        plan["conv_bn@nowhere"]


def test_apply_leaves_the_plan_reapplicable() -> None:
    model = ResNetLike().eval()
    plan = get_transformation_plan(model, COMMON_FUSION_PATTERNS, (IMAGE,))
    before_graph = format_graph(plan.model, literals=True)
    before_entries = [e.to_dict() for e in plan.entries]
    first = apply_transformation_plan(plan)
    second = apply_transformation_plan(plan)
    assert format_graph(plan.model, literals=True) == before_graph
    assert [e.to_dict() for e in plan.entries] == before_entries
    assert format_graph(first.model) == format_graph(second.model)
    with torch.no_grad():
        assert torch.equal(first.model(IMAGE), second.model(IMAGE))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("factory", [ResNetLike, MobileNetLike])
def test_user_model_is_never_mutated(factory) -> None:
    model = factory().eval()
    state, structure = _state(model), repr(model)
    result = transform(model, (IMAGE,), COMMON_FUSION_PATTERNS)
    assert result.report["applied_count"] > 0
    after = model.state_dict()
    assert state.keys() == after.keys()
    assert all(torch.equal(state[k], after[k]) for k in state)
    assert repr(model) == structure and not model.training
    assert not any(isinstance(m, FusedConv) for m in model.modules())


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)
        self.register_buffer("offset", torch.randn(4))
        self.scale = torch.tensor(2.0)  # a plain tensor attribute

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale + self.offset


def test_the_plan_shares_the_users_tensors_and_the_result_owns_its_own() -> None:
    """Tracing shares tensors (no 440 MB copy on BERT-base); whatever the result keeps is a
    copy, so training the QAT model, which writes into its weights, leaves the user's alone."""
    model = _Shared().eval()
    mine = {id(t) for t in (*model.parameters(), *model.buffers(), model.scale)}
    plan = get_transformation_plan(model, COMMON_FUSION_PATTERNS, (X,))
    assert {id(t) for t in plan.model.parameters()} <= mine  # nothing copied to plan
    result = apply_transformation_plan(plan).model
    kept = [*result.parameters(), *result.buffers()]
    kept += [v for m in result.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    assert kept and not {id(t) for t in kept} & mine
    assert not {t.untyped_storage().data_ptr() for t in kept} & {
        t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())
    }
    state = _state(model)
    qat = embedl_dynamo.prepare_qat(model, (X,), calibration_data=[(X,)], backend="tensorrt")
    loss = qat(X).square().sum()
    loss.backward()
    torch.optim.SGD([p for p in qat.parameters() if p.requires_grad], lr=1.0).step()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


class ReluForever(Pattern):
    """A broken conversion: its replacement is again a relu, so it matches its own output."""

    name = "relu_forever"
    phase = "conversion"

    @staticmethod
    def target(x):
        out = torch.relu(x)
        return out, {"out": out}

    def replace(self, m: Match) -> fx.Node:
        return m.call(torch.relu, input=m["x"])


def test_conversions_that_never_converge_raise_naming_the_pattern() -> None:
    with pytest.raises(RuntimeError) as info:
        get_transformation_plan(_Wrap(torch.relu), [ReluForever()], (X,))
    message = str(info.value)
    assert f"after {MAX_CONVERSION_ROUNDS} rounds" in message
    assert "['relu_forever']" in message


@pytest.mark.parametrize("factory", [ResNetLike, MobileNetLike])
def test_canonicalize_is_idempotent(factory) -> None:
    gm = canonicalize(trace(factory().eval(), (IMAGE,)))
    once = format_graph(gm, literals=True)
    canonicalize(gm)
    assert format_graph(gm, literals=True) == once
    assert "call_module" not in str(gm.graph)  # every module was canonicalised


def test_canonicalize_is_idempotent_on_a_dynamo_graph() -> None:
    gm, _ = dynamo_frozen(ResNetLike().eval(), IMAGE)
    canonicalize(gm)
    once = format_graph(gm, literals=True)
    canonicalize(gm)
    assert format_graph(gm, literals=True) == once


def test_positional_inplace_flag_is_canonicalised() -> None:
    """Dynamo records ``nn.Hardswish`` as ``F.hardswish(x, False)``."""
    gm = canonicalize(fx.symbolic_trace(_Wrap(lambda x: F.hardswish(x, False))))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert (
        node.target is F.hardswish
        and node.args == ()
        and dict(node.kwargs) == {"input": gm.graph.find_nodes(op="placeholder")[0]}
    )


def test_commutative_match_prefers_the_binding_that_can_be_rewritten() -> None:
    """``a + bn2(conv2(a))`` with ``a = bn1(conv1(x))``: both add inputs are BatchNorm outputs,
    but only ``bn2`` is private to the match (``a`` also feeds conv2)."""
    from embedl_dynamo.patterns.residual import CONV_BN_ADD
    from tests.models import randomize_batchnorm

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
            randomize_batchnorm(self)

        def forward(self, x):
            a = self.bn1(self.conv1(x))
            return a + self.bn2(self.conv2(a))

    model = Chain().eval()
    result = transform(model, (IMAGE,), [CONV_BN_ADD])
    (entry,) = result.plan.entries
    assert entry.id == "conv_bn_add@conv2" and entry.apply
    with torch.no_grad():
        assert (result.model(IMAGE) - model(IMAGE)).abs().max().item() <= 1e-5


def test_a_frozen_graph_keeps_sharing_the_constants_nothing_writes() -> None:
    """A compile's frozen graph holds the weights as constants: copying them (into the fused
    modules too) would double an LLM compile's memory for nothing."""
    model = _Shared().eval()
    frozen = fx.symbolic_trace(model)
    for name, p in list(frozen.named_parameters()):  # as freeze() has them: plain constants
        owner, _, leaf = name.rpartition(".")
        module = frozen.get_submodule(owner)
        del module._parameters[leaf]
        module.register_buffer(leaf, p.detach())
    plan = get_transformation_plan(frozen, COMMON_FUSION_PATTERNS, (X,))
    result = apply_transformation_plan(plan).model
    assert result.offset is frozen.offset  # read by an add only: shared
    fused = [n for n in result.graph.nodes if n.op == "call_module"]
    assert fused  # the linear+relu fusion reads the frozen weights, not a copy of them
    owned = {
        t.untyped_storage().data_ptr()
        for n in fused
        for t in result.get_submodule(str(n.target)).state_dict().values()
    }
    assert owned <= {t.untyped_storage().data_ptr() for t in frozen.buffers()}
    torch.testing.assert_close(result(X), model(X))
