"""ResNetLike and MobileNetLike through the ``tensorrt`` fusions: symbolic_trace and Dynamo paths."""

from __future__ import annotations

import expecttest
import torch
import torch.nn.functional as F
from torch import nn

from embedl_dynamo import transform
from embedl_dynamo.patterns.common import COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.fused_modules import FusedConv
from tests.helpers import dynamo_frozen
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
            str(traced.plan),
            """\
id                               pattern                    node                 apply  reason
-------------------------------  -------------------------  -------------------  -----  ----------------------------------------
stem_conv_bn_relu_maxpool@conv1  stem_conv_bn_relu_maxpool  max_pool2d           yes
conv_bn_add_relu@layer1.0.conv2  conv_bn_add_relu           relu_3               yes
conv_bn_add_relu@layer1.1.conv2  conv_bn_add_relu           relu_5               yes
conv_bn_add_relu@layer2.0.conv2  conv_bn_add_relu           relu_7               yes
conv_bn_add_relu@layer2.1.conv2  conv_bn_add_relu           relu_9               yes
conv_bn_add@layer1.0.conv2       conv_bn_add                add_4                no     overlaps conv_bn_add_relu@layer1.0.conv2
conv_bn_add@layer1.1.conv2       conv_bn_add                add_5                no     overlaps conv_bn_add_relu@layer1.1.conv2
conv_bn_add@layer2.0.conv2       conv_bn_add                add_6                no     overlaps conv_bn_add_relu@layer2.0.conv2
conv_bn_add@layer2.1.conv2       conv_bn_add                add_7                no     overlaps conv_bn_add_relu@layer2.1.conv2
conv_bn_relu@conv1               conv_bn_relu               relu_1               no     overlaps stem_conv_bn_relu_maxpool@conv1
conv_bn_relu@layer1.0.conv1      conv_bn_relu               relu_2               yes
conv_bn_relu@layer1.1.conv1      conv_bn_relu               relu_4               yes
conv_bn_relu@layer2.0.conv1      conv_bn_relu               relu_6               yes
conv_bn_relu@layer2.1.conv1      conv_bn_relu               relu_8               yes
conv_bn@conv1                    conv_bn                    batch_norm           no     overlaps stem_conv_bn_relu_maxpool@conv1
conv_bn@layer1.0.conv1           conv_bn                    batch_norm_1         no     overlaps conv_bn_relu@layer1.0.conv1
conv_bn@layer1.0.conv2           conv_bn                    batch_norm_2         no     overlaps conv_bn_add_relu@layer1.0.conv2
conv_bn@layer1.1.conv1           conv_bn                    batch_norm_3         no     overlaps conv_bn_relu@layer1.1.conv1
conv_bn@layer1.1.conv2           conv_bn                    batch_norm_4         no     overlaps conv_bn_add_relu@layer1.1.conv2
conv_bn@layer2.0.downsample.0    conv_bn                    batch_norm_5         yes
conv_bn@layer2.0.conv1           conv_bn                    batch_norm_6         no     overlaps conv_bn_relu@layer2.0.conv1
conv_bn@layer2.0.conv2           conv_bn                    batch_norm_7         no     overlaps conv_bn_add_relu@layer2.0.conv2
conv_bn@layer2.1.conv1           conv_bn                    batch_norm_8         no     overlaps conv_bn_relu@layer2.1.conv1
conv_bn@layer2.1.conv2           conv_bn                    batch_norm_9         no     overlaps conv_bn_add_relu@layer2.1.conv2
conv@conv1                       conv                       conv2d               no     overlaps stem_conv_bn_relu_maxpool@conv1
conv@layer1.0.conv1              conv                       conv2d_1             no     overlaps conv_bn_relu@layer1.0.conv1
conv@layer1.0.conv2              conv                       conv2d_2             no     overlaps conv_bn_add_relu@layer1.0.conv2
conv@layer1.1.conv1              conv                       conv2d_3             no     overlaps conv_bn_relu@layer1.1.conv1
conv@layer1.1.conv2              conv                       conv2d_4             no     overlaps conv_bn_add_relu@layer1.1.conv2
conv@layer2.0.downsample.0       conv                       conv2d_5             no     overlaps conv_bn@layer2.0.downsample.0
conv@layer2.0.conv1              conv                       conv2d_6             no     overlaps conv_bn_relu@layer2.0.conv1
conv@layer2.0.conv2              conv                       conv2d_7             no     overlaps conv_bn_add_relu@layer2.0.conv2
conv@layer2.1.conv1              conv                       conv2d_8             no     overlaps conv_bn_relu@layer2.1.conv1
conv@layer2.1.conv2              conv                       conv2d_9             no     overlaps conv_bn_add_relu@layer2.1.conv2
linear@fc                        linear                     linear               yes
adaptive_avg_pool@avgpool        adaptive_avg_pool          adaptive_avg_pool2d  yes""",
        )

    def test_mobilenet_like(self) -> None:
        model = MobileNetLike().eval()
        traced, dynamo, inputs = _transform_both(model)
        _check_equal(model, traced, dynamo, inputs)
        assert _fused_fraction(traced)[0] == 0
        assert _fused_fraction(dynamo)[0] == 0
        assert _applied(traced.plan) == _applied(dynamo.plan)
        self.assertExpectedInline(
            str(traced.plan),
            """\
id                                      pattern            node                   apply  reason
--------------------------------------  -----------------  ---------------------  -----  -----------------------------------------------
conv_bn_add@blocks.0.project.0          conv_bn_add        add_2                  yes
conv_bn_add@blocks.2.project.0          conv_bn_add        add_3                  yes
conv_bn_hardswish@stem.0                conv_bn_hardswish  hardswish              yes
conv_bn_hardswish@blocks.0.expand.0     conv_bn_hardswish  hardswish_1            yes
conv_bn_hardswish@blocks.0.depthwise.0  conv_bn_hardswish  hardswish_2            yes
conv_bn_hardswish@blocks.1.expand.0     conv_bn_hardswish  hardswish_3            yes
conv_bn_hardswish@blocks.1.depthwise.0  conv_bn_hardswish  hardswish_4            yes
conv_bn_hardswish@blocks.2.expand.0     conv_bn_hardswish  hardswish_5            yes
conv_bn_hardswish@blocks.2.depthwise.0  conv_bn_hardswish  hardswish_6            yes
conv_bn@stem.0                          conv_bn            batch_norm             no     overlaps conv_bn_hardswish@stem.0
conv_bn@blocks.0.expand.0               conv_bn            batch_norm_1           no     overlaps conv_bn_hardswish@blocks.0.expand.0
conv_bn@blocks.0.depthwise.0            conv_bn            batch_norm_2           no     overlaps conv_bn_hardswish@blocks.0.depthwise.0
conv_bn@blocks.0.project.0              conv_bn            batch_norm_3           no     overlaps conv_bn_add@blocks.0.project.0
conv_bn@blocks.1.expand.0               conv_bn            batch_norm_4           no     overlaps conv_bn_hardswish@blocks.1.expand.0
conv_bn@blocks.1.depthwise.0            conv_bn            batch_norm_5           no     overlaps conv_bn_hardswish@blocks.1.depthwise.0
conv_bn@blocks.1.project.0              conv_bn            batch_norm_6           yes
conv_bn@blocks.2.expand.0               conv_bn            batch_norm_7           no     overlaps conv_bn_hardswish@blocks.2.expand.0
conv_bn@blocks.2.depthwise.0            conv_bn            batch_norm_8           no     overlaps conv_bn_hardswish@blocks.2.depthwise.0
conv_bn@blocks.2.project.0              conv_bn            batch_norm_9           no     overlaps conv_bn_add@blocks.2.project.0
conv_relu@blocks.0.se.fc1               conv_relu          relu_2                 yes
conv_relu@blocks.2.se.fc1               conv_relu          relu_3                 yes
conv_hardsigmoid@blocks.0.se.fc2        conv_hardsigmoid   hardsigmoid_2          yes
conv_hardsigmoid@blocks.2.se.fc2        conv_hardsigmoid   hardsigmoid_3          yes
linear_hardswish@classifier.0           linear_hardswish   hardswish_7            yes
conv@stem.0                             conv               conv2d                 no     overlaps conv_bn_hardswish@stem.0
conv@blocks.0.expand.0                  conv               conv2d_1               no     overlaps conv_bn_hardswish@blocks.0.expand.0
conv@blocks.0.depthwise.0               conv               conv2d_2               no     overlaps conv_bn_hardswish@blocks.0.depthwise.0
conv@blocks.0.se.fc1                    conv               conv2d_3               no     overlaps conv_relu@blocks.0.se.fc1
conv@blocks.0.se.fc2                    conv               conv2d_4               no     overlaps conv_hardsigmoid@blocks.0.se.fc2
conv@blocks.0.project.0                 conv               conv2d_5               no     overlaps conv_bn_add@blocks.0.project.0
conv@blocks.1.expand.0                  conv               conv2d_6               no     overlaps conv_bn_hardswish@blocks.1.expand.0
conv@blocks.1.depthwise.0               conv               conv2d_7               no     overlaps conv_bn_hardswish@blocks.1.depthwise.0
conv@blocks.1.project.0                 conv               conv2d_8               no     overlaps conv_bn@blocks.1.project.0
conv@blocks.2.expand.0                  conv               conv2d_9               no     overlaps conv_bn_hardswish@blocks.2.expand.0
conv@blocks.2.depthwise.0               conv               conv2d_10              no     overlaps conv_bn_hardswish@blocks.2.depthwise.0
conv@blocks.2.se.fc1                    conv               conv2d_11              no     overlaps conv_relu@blocks.2.se.fc1
conv@blocks.2.se.fc2                    conv               conv2d_12              no     overlaps conv_hardsigmoid@blocks.2.se.fc2
conv@blocks.2.project.0                 conv               conv2d_13              no     overlaps conv_bn_add@blocks.2.project.0
linear@classifier.0                     linear             linear                 no     overlaps linear_hardswish@classifier.0
linear@classifier.3                     linear             linear_1               yes
adaptive_avg_pool@blocks.0.se.pool      adaptive_avg_pool  adaptive_avg_pool2d    yes
adaptive_avg_pool@blocks.2.se.pool      adaptive_avg_pool  adaptive_avg_pool2d_1  yes
adaptive_avg_pool@pool                  adaptive_avg_pool  adaptive_avg_pool2d_2  yes""",
        )
