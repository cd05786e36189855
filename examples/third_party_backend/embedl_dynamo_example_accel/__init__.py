"""ExampleAccel: a fictional accelerator that runs convolutions fused with BatchNorm and ReLU.

A vendor package needs only a :class:`embedl_dynamo.Backend` and two entry points (see this
package's ``pyproject.toml``). It picks the patterns its compiler fuses, here a subset of the
built-in ones plus all structural conversions; its own patterns (subclasses of
:class:`embedl_dynamo.Pattern`) would go in the same lists.
"""

from __future__ import annotations

from embedl_dynamo import Backend
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS
from embedl_dynamo.patterns.conv_bn import CONV_BN, CONV_BN_RELU

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="exampleaccel",
    conversion_patterns=COMMON_CONVERSION_PATTERNS,
    fusion_patterns=(CONV_BN_RELU, CONV_BN),
    description="ExampleAccel NPU (example plug-in): conv+BN(+ReLU) kernels, float only",
)
