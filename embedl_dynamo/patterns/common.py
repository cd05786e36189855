"""The conversion and fusion patterns the built-in targets share: one ordered list each.

The targets that run plain Conv / Gemm / MatMul nodes (``tensorrt``, ``onnxruntime``,
``openvino``) take both lists, ``lattice`` the conversions only; what differs between them is
their INT8 placement, in each target's module under :mod:`embedl_dynamo.backends`.

Lists are ordered longest first; the engine sorts fusions by size anyway, so the order here only
breaks ties.
"""

from __future__ import annotations

from embedl_dynamo.patterns.adaptive_pool import ADAPTIVE_POOL_PATTERNS
from embedl_dynamo.patterns.attention import ATTENTION_FUSION_PATTERNS
from embedl_dynamo.patterns.attention_decompose import ATTENTION_CONVERSION_PATTERNS
from embedl_dynamo.patterns.conv import CONV_PATTERNS
from embedl_dynamo.patterns.conv_bn import CONV_BN_PATTERNS
from embedl_dynamo.patterns.conversions import CONVERSION_PATTERNS
from embedl_dynamo.patterns.explicit_attention import EXPLICIT_ATTENTION_PATTERNS
from embedl_dynamo.patterns.grouped_query import GROUPED_QUERY_PATTERNS
from embedl_dynamo.patterns.linear import LINEAR_PATTERNS
from embedl_dynamo.patterns.pooling import AdaptiveAvgPool, StemConvBNReLUMaxPool
from embedl_dynamo.patterns.residual import RESIDUAL_PATTERNS

__all__ = ["COMMON_CONVERSION_PATTERNS", "COMMON_FUSION_PATTERNS"]

COMMON_CONVERSION_PATTERNS = (
    *GROUPED_QUERY_PATTERNS,
    *ATTENTION_CONVERSION_PATTERNS,
    *EXPLICIT_ATTENTION_PATTERNS,
    *CONVERSION_PATTERNS,
    *ADAPTIVE_POOL_PATTERNS,
)
# conv / linear / pooling fusions, longest first (stem and residual: 4 nodes, conv-bn-act: 3...),
# then the attention fusions
COMMON_FUSION_PATTERNS = (
    StemConvBNReLUMaxPool(),
    *RESIDUAL_PATTERNS,
    *CONV_BN_PATTERNS,
    *CONV_PATTERNS,
    *LINEAR_PATTERNS,
    AdaptiveAvgPool(),
    *ATTENTION_FUSION_PATTERNS,
)
