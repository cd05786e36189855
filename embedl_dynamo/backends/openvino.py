"""The ``openvino`` target: Intel OpenVINO's CPU plugin.

Conversions and fusions are the shared ones (:mod:`embedl_dynamo.patterns.common`: plain
Conv/Gemm/MatMul nodes, which OpenVINO fuses too). The INT8 placement is NNCF's for the CPU
(``OPENVINO_QUANTIZED_PATTERNS``): OpenVINO's low-precision transformations turn Q/DQ into
integer kernels where NNCF would put its FakeQuantize ops, depthwise convs, squeeze-excite scales
and the ``q k^T`` of attention included. SmoothQuant (the shared list of
:mod:`embedl_dynamo.backends.common`) migrates LayerNorm -> Linear activation ranges into the
weights, as NNCF does for transformers.
"""

from __future__ import annotations

from embedl_dynamo.backend import Backend
from embedl_dynamo.backends.attention_placement import QuantFusedAttention
from embedl_dynamo.backends.common import COMMON_SMOOTH_PATTERNS
from embedl_dynamo.backends.placement_rules import (
    QuantChannelScale,
    QuantConv,
    QuantFusedModule,
    QuantLinear,
    QuantMatMul,
    QuantMaxPoolInput,
    QuantResidualAdd,
)
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS, COMMON_FUSION_PATTERNS
from embedl_dynamo.patterns.pooling import StemConvBNReLUMaxPool
from embedl_dynamo.quant.int8.spec import OPENVINO_INT8

__all__ = ["BACKEND", "OPENVINO_FUSION_PATTERNS", "OPENVINO_QUANTIZED_PATTERNS"]

# The shared fusions less the ResNet stem's conv-bn-relu-maxpool group: OpenVINO fuses the conv
# and relu itself and exports the same nodes either way, but INT8 needs the Q/DQ between the
# relu and the pool (QuantMaxPoolInput), which a fused group would hide.
OPENVINO_FUSION_PATTERNS = tuple(
    p for p in COMMON_FUSION_PATTERNS if not isinstance(p, StemConvBNReLUMaxPool)
)

# NNCF's CPU placement (what OpenVINO's low-precision transformations turn into integer
# kernels): every conv, depthwise included; linears and activation matmuls; residual adds
# (a transformer's stream stays float, as NNCF leaves it); squeeze-excite scales; a max pool's
# input rather than its output (NNCF's propagation: the pool runs on integers); in attention
# q and k only.
OPENVINO_QUANTIZED_PATTERNS = (
    QuantConv("quant_conv_ov", grouped=True),
    QuantLinear("quant_linear_ov"),
    QuantMatMul(),
    QuantResidualAdd("quant_residual_add_ov", float_stream=True),
    QuantChannelScale(),
    QuantMaxPoolInput(),
    QuantFusedAttention("quant_fused_attention_ov", operands=("0", "1"), head_sizes=None),
    QuantFusedModule(),
)

BACKEND = Backend(
    name="openvino",
    conversion_patterns=COMMON_CONVERSION_PATTERNS,
    fusion_patterns=OPENVINO_FUSION_PATTERNS,
    smooth_patterns=COMMON_SMOOTH_PATTERNS,
    quantized_patterns=OPENVINO_QUANTIZED_PATTERNS,
    quantization=OPENVINO_INT8,
    runtimes=("openvino",),
    description="Intel OpenVINO CPU: NNCF's INT8 placement (depthwise, squeeze-excite, q k^T)",
)
