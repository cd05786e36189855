"""The vocabulary of the conformance table: verdicts, rules, known differences, rows."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

__all__ = [
    "CPU_RUNTIMES",
    "DTYPE_CLASSES",
    "Difference",
    "FLOAT_ATOL",
    "FLOAT_RTOL",
    "OpRow",
    "Rule",
    "STRUCTURAL",
    "Verdict",
]

#: the runtimes the table speaks for
CPU_RUNTIMES = ("onnxruntime", "openvino")
#: the families of input dtypes a :class:`Rule` speaks for
DTYPE_CLASSES = ("any", "float", "int", "bool")
#: the ``bounded`` verdict's absolute bound on float outputs
FLOAT_ATOL = 1e-5
#: ... and its bound relative to the largest magnitude of the output
FLOAT_RTOL = 1e-4
#: :attr:`OpRow.checked_by` of a row that computes no tensor values a runtime could compute
#: otherwise (sizes, constants, a no-op): nothing to sample
STRUCTURAL = "structural"


class Verdict(enum.Enum):
    """How a runtime computes an op, compared with PyTorch."""

    EXACT = "exact"
    BOUNDED = "bounded"
    KEPT = "kept in PyTorch"


@dataclass(frozen=True)
class Rule:
    """The verdict on one op for one runtime and one family of input dtypes.

    Attributes:
        verdict: exact, bounded or kept.
        dtypes: ``float``, ``int`` (integers and bools), ``bool`` or ``any``: the first tensor
            input's (a row lists a ``bool`` rule before its ``int`` rule: the first that
            covers the dtype applies).
        reason: why (for ``kept``: what the runtime computes instead; else how it holds).
    """

    verdict: Verdict
    dtypes: str = "any"
    reason: str = ""

    def __post_init__(self) -> None:
        if self.dtypes not in DTYPE_CLASSES:
            raise ValueError(f"Rule dtypes {self.dtypes!r}: use one of {DTYPE_CLASSES}")

    def covers(self, dtype: torch.dtype | None) -> bool:
        """Whether this rule speaks for an input of ``dtype`` (None: unknown, every rule)."""
        if self.dtypes == "any" or dtype is None:
            return True
        if self.dtypes == "bool":
            return dtype == torch.bool
        return (self.dtypes == "float") == (dtype.is_floating_point or dtype.is_complex)


@dataclass(frozen=True)
class Difference:
    """A known way a runtime computes an op otherwise than PyTorch on some edge value, neither
    made exact nor kept in PyTorch, since doing so would cost every model the op's speed;
    listed here, in the one place, with its reason (the suite expects it to show).

    Attributes:
        runtime: the runtime.
        edge: the edge values that show it (``nan``, ``inf``, ``-inf``): a suite label prefix.
        reason: what the runtime computes instead, and why it stays.
    """

    runtime: str
    edge: str
    reason: str


@dataclass(frozen=True)
class OpRow:
    """One op: its PyTorch names, the samples that check it, the rules.

    Attributes:
        op: the name of the torch function / Tensor method (``torch.max``, ``Tensor.max``).
        opinfo: names in PyTorch's ``op_db`` whose samples check it.
        rules: runtime name -> rules, the first that covers the dtype applies.
        aliases: other names of the op in a graph (``F.relu``, ``relu_``...).
        differs: the known differences on edge values (:class:`Difference`).
        checked_by: for a row without OpInfo samples: the test file (under ``tests/``) whose
            samples check it, or :data:`STRUCTURAL`.
    """

    op: str
    opinfo: tuple[str, ...]
    rules: Mapping[str, tuple[Rule, ...]]
    aliases: tuple[str, ...] = field(default=())
    differs: tuple[Difference, ...] = field(default=())
    checked_by: str = ""
