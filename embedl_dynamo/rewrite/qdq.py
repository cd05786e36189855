"""Where Quantize/DequantizeLinear pairs go: :class:`Role`, :class:`QDQ` and :class:`FusedModule`.

Patterns and fused modules *declare* QDQ positions as data; the quantization stage reads them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

__all__ = ["QDQ", "FusedModule", "Role"]


class Role(str, enum.Enum):
    """What a quantized position holds; the target's quantization config maps it to a spec.

    Example:
        >>> from embedl_dynamo import Role
        >>> ", ".join(role.name for role in Role)
        'ACTIVATION, WEIGHT, BIAS, OUTPUT'
    """

    ACTIVATION = "activation"
    WEIGHT = "weight"
    BIAS = "bias"
    OUTPUT = "output"


@dataclass(frozen=True)
class QDQ:
    """Where a pattern (or fused module) wants Quantize/DequantizeLinear pairs: data, not code.

    Attributes:
        inputs: match names (pattern arguments) whose values are quantized on the way in.
        weights: match names of constant weights quantized per channel inside the fused op.
        output: the role of the pattern's output when it is quantized on the way out, or None.

    Example:
        ```python
        qdq = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT})  # a Pattern's
        ```
    """

    inputs: Mapping[str, Role] = field(default_factory=dict)
    weights: Mapping[str, Role] = field(default_factory=dict)
    output: Role | None = None

    def __post_init__(self) -> None:
        for mapping in (self.inputs, self.weights):
            for name, role in mapping.items():
                if not isinstance(role, Role):
                    raise TypeError(f"QDQ position {name!r} needs a Role, got {role!r}")
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "weights", dict(self.weights))

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": {k: v.value for k, v in self.inputs.items()},
            "weights": {k: v.value for k, v in self.weights.items()},
            "output": self.output.value if self.output else None,
        }

    @property
    def empty(self) -> bool:
        return not self.inputs and not self.weights and self.output is None


class FusedModule(nn.Module):
    """Base of the modules fusions put in the graph; declares where QDQ goes around it.

    ``qdq.inputs`` names forward arguments by position (``"0"``, ``"1"``), ``qdq.weights``
    names the module's own parameters (``"weight"``) quantized per output channel.

    Example:
        ```python
        class FusedScale(FusedModule):
            qdq = QDQ(inputs={"0": Role.ACTIVATION})  # QDQ before its first forward argument

            def forward(self, x):
                return x * 2
        ```
    """

    qdq: ClassVar[QDQ] = QDQ()

    def extra_repr(self) -> str:
        return ""
