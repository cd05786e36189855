"""The ``lattice`` target: Lattice FPGA flow; conversions only (fusions and INT8 to come)."""

from __future__ import annotations

from embedl_dynamo.backend import Backend
from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="lattice",
    conversion_patterns=COMMON_CONVERSION_PATTERNS,
    description="Lattice FPGAs: structural conversions only",
)
