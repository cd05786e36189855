"""ResNetLike and MobileNetLike through the ``tensorrt`` fusions: symbolic_trace and Dynamo paths."""

from __future__ import annotations

import expecttest
import torch
import torch.nn.functional as F
from torch import nn

from embedl_dynamo import transform
from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.fused_modules import FusedConv
from tests.helpers import dynamo_frozen, plan_table
from tests.models import MobileNetLike, ResNetLike

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _fused_fraction(result) -> tuple[int, int]:
    """(conv/bn nodes left unfused, FusedConv modules) in the transformed graph."""
    left = [
        n
        for n in result.model.graph.nodes
        if n.op == "call_function" and n.target in (torch.conv2d, F.batch_norm)
    ]
    fused = [m for m in result.model.modules() if isinstance(m, FusedConv)]
    return len(left), len(fused)


def _transform_both(model: nn.Module):
    """(symbolic_trace result, Dynamo result, Dynamo user inputs) for ``model``."""
    traced = transform(model, (X,), COMMON_FUSION_PATTERNS)
    gm, inputs = dynamo_frozen(model, X)
    dynamo = transform(gm, inputs, COMMON_FUSION_PATTERNS)
    return traced, dynamo, inputs


def _check_equal(model: nn.Module, traced, dynamo, inputs) -> None:
    with torch.no_grad():
        expected = model(X)
        assert (traced.model(X) - expected).abs().max().item() <= 1e-5
        (out,) = dynamo.model(*inputs)
        assert (out - expected).abs().max().item() <= 1e-5


def _applied(plan) -> list[str]:
    return sorted(e.id for e in plan.entries if e.apply)


class CNNArchitectures(expecttest.TestCase):
    def test_resnet_like(self) -> None:
        model = ResNetLike().eval()
        traced, dynamo, inputs = _transform_both(model)
        _check_equal(model, traced, dynamo, inputs)
        assert _fused_fraction(traced) == (0, 10)
        assert _fused_fraction(dynamo) == (0, 10)
        # both capture paths find the same fusions under the same ids
        assert _applied(traced.plan) == _applied(dynamo.plan)
        self.assertExpectedInline(
            plan_table(traced.plan),
            """\
id                               pattern                    apply  reason
-------------------------------  -------------------------  -----  ----------------------------------------
stem_conv_bn_relu_maxpool@conv1  stem_conv_bn_relu_maxpool  yes
conv_bn_add_relu@layer1.0.conv2  conv_bn_add_relu           yes
conv_bn_add_relu@layer1.1.conv2  conv_bn_add_relu           yes
conv_bn_add_relu@layer2.0.conv2  conv_bn_add_relu           yes
conv_bn_add_relu@layer2.1.conv2  conv_bn_add_relu           yes
conv_bn_add@layer1.0.conv2       conv_bn_add                no     overlaps conv_bn_add_relu@layer1.0.conv2
conv_bn_add@layer1.1.conv2       conv_bn_add                no     overlaps conv_bn_add_relu@layer1.1.conv2
conv_bn_add@layer2.0.conv2       conv_bn_add                no     overlaps conv_bn_add_relu@layer2.0.conv2
conv_bn_add@layer2.1.conv2       conv_bn_add                no     overlaps conv_bn_add_relu@layer2.1.conv2
conv_bn_relu@conv1               conv_bn_relu               no     overlaps stem_conv_bn_relu_maxpool@conv1
conv_bn_relu@layer1.0.conv1      conv_bn_relu               yes
conv_bn_relu@layer1.1.conv1      conv_bn_relu               yes
conv_bn_relu@layer2.0.conv1      conv_bn_relu               yes
conv_bn_relu@layer2.1.conv1      conv_bn_relu               yes
conv_bn@conv1                    conv_bn                    no     overlaps stem_conv_bn_relu_maxpool@conv1
conv_bn@layer1.0.conv1           conv_bn                    no     overlaps conv_bn_relu@layer1.0.conv1
conv_bn@layer1.0.conv2           conv_bn                    no     overlaps conv_bn_add_relu@layer1.0.conv2
conv_bn@layer1.1.conv1           conv_bn                    no     overlaps conv_bn_relu@layer1.1.conv1
conv_bn@layer1.1.conv2           conv_bn                    no     overlaps conv_bn_add_relu@layer1.1.conv2
conv_bn@layer2.0.downsample.0    conv_bn                    yes
conv_bn@layer2.0.conv1           conv_bn                    no     overlaps conv_bn_relu@layer2.0.conv1
conv_bn@layer2.0.conv2           conv_bn                    no     overlaps conv_bn_add_relu@layer2.0.conv2
conv_bn@layer2.1.conv1           conv_bn                    no     overlaps conv_bn_relu@layer2.1.conv1
conv_bn@layer2.1.conv2           conv_bn                    no     overlaps conv_bn_add_relu@layer2.1.conv2
conv@conv1                       conv                       no     overlaps stem_conv_bn_relu_maxpool@conv1
conv@layer1.0.conv1              conv                       no     overlaps conv_bn_relu@layer1.0.conv1
conv@layer1.0.conv2              conv                       no     overlaps conv_bn_add_relu@layer1.0.conv2
conv@layer1.1.conv1              conv                       no     overlaps conv_bn_relu@layer1.1.conv1
conv@layer1.1.conv2              conv                       no     overlaps conv_bn_add_relu@layer1.1.conv2
conv@layer2.0.downsample.0       conv                       no     overlaps conv_bn@layer2.0.downsample.0
conv@layer2.0.conv1              conv                       no     overlaps conv_bn_relu@layer2.0.conv1
conv@layer2.0.conv2              conv                       no     overlaps conv_bn_add_relu@layer2.0.conv2
conv@layer2.1.conv1              conv                       no     overlaps conv_bn_relu@layer2.1.conv1
conv@layer2.1.conv2              conv                       no     overlaps conv_bn_add_relu@layer2.1.conv2
linear@fc                        linear                     yes
adaptive_avg_pool@avgpool        adaptive_avg_pool          yes""",
        )

    def test_mobilenet_like(self) -> None:
        model = MobileNetLike().eval()
        traced, dynamo, inputs = _transform_both(model)
        _check_equal(model, traced, dynamo, inputs)
        assert _fused_fraction(traced)[0] == 0
        assert _fused_fraction(dynamo)[0] == 0
        assert _applied(traced.plan) == _applied(dynamo.plan)
        self.assertExpectedInline(
            plan_table(traced.plan),
            """\
id                                      pattern            apply  reason
--------------------------------------  -----------------  -----  -----------------------------------------------
conv_bn_add@blocks.0.project.0          conv_bn_add        yes
conv_bn_add@blocks.2.project.0          conv_bn_add        yes
conv_bn_hardswish@stem.0                conv_bn_hardswish  yes
conv_bn_hardswish@blocks.0.expand.0     conv_bn_hardswish  yes
conv_bn_hardswish@blocks.0.depthwise.0  conv_bn_hardswish  yes
conv_bn_hardswish@blocks.1.expand.0     conv_bn_hardswish  yes
conv_bn_hardswish@blocks.1.depthwise.0  conv_bn_hardswish  yes
conv_bn_hardswish@blocks.2.expand.0     conv_bn_hardswish  yes
conv_bn_hardswish@blocks.2.depthwise.0  conv_bn_hardswish  yes
conv_bn@stem.0                          conv_bn            no     overlaps conv_bn_hardswish@stem.0
conv_bn@blocks.0.expand.0               conv_bn            no     overlaps conv_bn_hardswish@blocks.0.expand.0
conv_bn@blocks.0.depthwise.0            conv_bn            no     overlaps conv_bn_hardswish@blocks.0.depthwise.0
conv_bn@blocks.0.project.0              conv_bn            no     overlaps conv_bn_add@blocks.0.project.0
conv_bn@blocks.1.expand.0               conv_bn            no     overlaps conv_bn_hardswish@blocks.1.expand.0
conv_bn@blocks.1.depthwise.0            conv_bn            no     overlaps conv_bn_hardswish@blocks.1.depthwise.0
conv_bn@blocks.1.project.0              conv_bn            yes
conv_bn@blocks.2.expand.0               conv_bn            no     overlaps conv_bn_hardswish@blocks.2.expand.0
conv_bn@blocks.2.depthwise.0            conv_bn            no     overlaps conv_bn_hardswish@blocks.2.depthwise.0
conv_bn@blocks.2.project.0              conv_bn            no     overlaps conv_bn_add@blocks.2.project.0
conv_relu@blocks.0.se.fc1               conv_relu          yes
conv_relu@blocks.2.se.fc1               conv_relu          yes
conv_hardsigmoid@blocks.0.se.fc2        conv_hardsigmoid   yes
conv_hardsigmoid@blocks.2.se.fc2        conv_hardsigmoid   yes
linear_hardswish@classifier.0           linear_hardswish   yes
conv@stem.0                             conv               no     overlaps conv_bn_hardswish@stem.0
conv@blocks.0.expand.0                  conv               no     overlaps conv_bn_hardswish@blocks.0.expand.0
conv@blocks.0.depthwise.0               conv               no     overlaps conv_bn_hardswish@blocks.0.depthwise.0
conv@blocks.0.se.fc1                    conv               no     overlaps conv_relu@blocks.0.se.fc1
conv@blocks.0.se.fc2                    conv               no     overlaps conv_hardsigmoid@blocks.0.se.fc2
conv@blocks.0.project.0                 conv               no     overlaps conv_bn_add@blocks.0.project.0
conv@blocks.1.expand.0                  conv               no     overlaps conv_bn_hardswish@blocks.1.expand.0
conv@blocks.1.depthwise.0               conv               no     overlaps conv_bn_hardswish@blocks.1.depthwise.0
conv@blocks.1.project.0                 conv               no     overlaps conv_bn@blocks.1.project.0
conv@blocks.2.expand.0                  conv               no     overlaps conv_bn_hardswish@blocks.2.expand.0
conv@blocks.2.depthwise.0               conv               no     overlaps conv_bn_hardswish@blocks.2.depthwise.0
conv@blocks.2.se.fc1                    conv               no     overlaps conv_relu@blocks.2.se.fc1
conv@blocks.2.se.fc2                    conv               no     overlaps conv_hardsigmoid@blocks.2.se.fc2
conv@blocks.2.project.0                 conv               no     overlaps conv_bn_add@blocks.2.project.0
linear@classifier.0                     linear             no     overlaps linear_hardswish@classifier.0
linear@classifier.3                     linear             yes
adaptive_avg_pool@blocks.0.se.pool      adaptive_avg_pool  yes
adaptive_avg_pool@blocks.2.se.pool      adaptive_avg_pool  yes
adaptive_avg_pool@pool                  adaptive_avg_pool  yes""",
        )
