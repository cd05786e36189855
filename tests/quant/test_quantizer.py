"""Each target owns a quantizer (torchao's shape): prepare, annotate, validate; typed rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import transform
from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.lattice import BACKEND as LATTICE
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.placement_rules import QuantConv
from embedl_dynamo.backends.tensorrt import BACKEND as TENSORRT
from embedl_dynamo.patterns.conv_bn import CONV_BN_RELU
from embedl_dynamo.quant import Quantizer
from embedl_dynamo.quant.int8.placement import Placement
from embedl_dynamo.rewrite.qdq import Role
from tests.models import randomize_batchnorm


class _Block(nn.Module):
    """A dense conv-bn-relu and a depthwise conv with 6 channels (not a multiple of 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dw(torch.relu(self.bn(self.conv(x))))


X = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _fused(backend: Backend):
    model = randomize_batchnorm(_Block().eval())
    return transform(model, (X,), [*backend.conversion_patterns, *backend.fusion_patterns]).model


def test_tensorrt_quantizer_annotates_and_says_what_stays_in_float():
    gm = _fused(TENSORRT)
    quantizer = TENSORRT.quantizer
    quantizer.transform_for_annotation(gm, [(X,)])
    placement = quantizer.annotate(gm)
    quantizer.validate(gm, placement)
    assert placement.quantized_layers == ["quant_conv@conv"]
    (ident, reason), *_ = placement.float_layers
    assert ident == "quant_conv@dw"
    assert "groups=6" in reason and "not multiples of 4" in reason
    assert set(placement.activations.values()) == {Role.ACTIVATION}
    assert len(placement.weights) == 1  # the dense conv's weight, per channel


def test_onnxruntime_quantizer_prepares_and_quantizes_outputs():
    gm = _fused(ONNXRUNTIME)
    quantizer = ONNXRUNTIME.quantizer
    prepared = quantizer.transform_for_annotation(gm, [(X,)])
    assert prepared == {"smoothed": [], "rewritten": []}  # nothing fused with an add or a pool
    placement = quantizer.annotate(gm)
    # ORT wants Q/DQ on the conv's (post-ReLU) output too; the depthwise conv stays in float
    conv_node = next(
        n for n in gm.graph.nodes if n.op == "call_module" and "conv_bn_relu" in n.name
    )
    assert set(placement.activations) == {"x", conv_node.name}
    assert placement.quantized_layers == ["quant_conv_ort@conv"]
    assert [ident for ident, _ in placement.float_layers] == ["quant_conv_ort@dw"]


def test_validate_refuses_a_placement_naming_what_the_graph_lacks():
    gm = _fused(TENSORRT)
    placement = Placement(activations={"no_such_node": Role.ACTIVATION})
    with pytest.raises(
        ValueError, match=r"tensorrt quantizer: no graph value named \['no_such_node'\]"
    ):
        TENSORRT.quantizer.validate(gm, placement)


def test_a_target_without_int8_says_which_have_it():
    with pytest.raises(ValueError, match=r"'lattice' has no INT8 quantization config; use one of"):
        LATTICE.quantizer  # noqa: B018


def test_each_phase_takes_only_its_own_protocol():
    with pytest.raises(TypeError, match=r"quantized_patterns holds .* not a PlacementRule"):
        Backend(name="bad", quantized_patterns=(CONV_BN_RELU,))
    with pytest.raises(TypeError, match=r"fusion_patterns holds .* not a Pattern instance"):
        Backend(name="bad", fusion_patterns=(QuantConv("quant_conv"),))
    with pytest.raises(TypeError, match="not a PlacementRule or PreparationRewrite"):
        Quantizer("bad", TENSORRT.quantization, rules=(CONV_BN_RELU,))


def test_a_rule_variant_is_an_instance_with_arguments():
    tensorrt_conv = QuantConv("quant_conv")
    ort_conv = QuantConv("quant_conv_ort", output=Role.ACTIVATION)
    assert tensorrt_conv == QuantConv("quant_conv") and tensorrt_conv != ort_conv
    assert tensorrt_conv.qdq.output is None and ort_conv.qdq.output is Role.ACTIVATION
    assert ort_conv.module_output is Role.ACTIVATION
