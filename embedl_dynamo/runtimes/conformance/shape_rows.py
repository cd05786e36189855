"""The conformance table's rows for ops that move, pick or mask values without arithmetic
beyond those of :mod:`.table` (``tril``, ``index_select``, ``tile``, ``movedim``...): each
exact where the runtime builds it. See the package's docstring for the verdicts."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.shorthands import EXACT, both

__all__ = ["SHAPE_ROWS"]

_TRILU = Rule(
    Verdict.EXACT,
    reason="ONNX Runtime has no uint8 Trilu kernel: a uint8 input fails to build, loudly, and "
    "runs in PyTorch",
)

_OV_HSTACK = Rule(
    Verdict.KEPT,
    reason="OpenVINO's ONNX frontend fails to convert the export's form of it "
    "(OpConversionFailure at build)",
)

SHAPE_ROWS: tuple[OpRow, ...] = (
    *(
        OpRow(op, (op,), {"onnxruntime": (_TRILU,), "openvino": (EXACT,)})
        for op in ("tril", "triu")
    ),
    OpRow("index_select", ("index_select",), both(EXACT)),
    OpRow("tile", ("tile",), both(EXACT)),
    OpRow("vstack", ("vstack",), both(EXACT)),
    OpRow("hstack", ("hstack",), {"onnxruntime": (EXACT,), "openvino": (_OV_HSTACK,)}),
    OpRow("movedim", ("movedim",), both(EXACT), ("moveaxis",)),
)
