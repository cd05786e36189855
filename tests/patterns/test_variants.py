"""Pattern variants are instances of one parametrised class; the plan's seed-API view."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedl_dynamo import apply_transformation_plan, get_transformation_plan
from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.conv_bn import CONV_BN_RELU, CONV_BN_SILU, ConvBNActivation
from embedl_dynamo.patterns.fused_modules import FusedConv
from tests.models import ResNetLike, randomize_batchnorm


def test_variants_compile_their_own_target_and_compare_by_arguments():
    assert CONV_BN_RELU == ConvBNActivation("conv_bn_relu", torch.relu)
    assert CONV_BN_RELU != CONV_BN_SILU
    assert CONV_BN_RELU.compiled() is not CONV_BN_SILU.compiled()
    relu_ops = {n.target for n in CONV_BN_RELU.compiled().graph.nodes if n.op == "call_function"}
    silu_ops = {n.target for n in CONV_BN_SILU.compiled().graph.nodes if n.op == "call_function"}
    assert torch.relu in relu_ops and F.silu in silu_ops
    assert CONV_BN_RELU.compiled() is CONV_BN_RELU.compiled()  # traced once per instance
    assert repr(CONV_BN_RELU) == "ConvBNActivation('conv_bn_relu', activation='relu')"


def test_plan_matches_is_the_node_then_pattern_view_and_apply_false_skips():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(1, 3, 16, 16)
    plan = get_transformation_plan(model, COMMON_FUSION_PATTERNS, args=(x,))
    by_node = plan.matches
    entry = next(e for e in plan.entries if e.pattern is CONV_BN_RELU and e.apply)
    assert by_node[entry.node]["conv_bn_relu"] is entry
    before = sum(isinstance(m, FusedConv) for m in apply_transformation_plan(plan).model.modules())
    by_node[entry.node]["conv_bn_relu"].apply = False
    after = sum(isinstance(m, FusedConv) for m in apply_transformation_plan(plan).model.modules())
    assert after == before - 1
