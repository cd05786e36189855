"""The conformance table's rows for ``F.unfold`` and ``F.fold`` (``nn.Unfold``, ``nn.Fold``:
the patch embedding of MobileViTV2), in a block of their own. ``Tensor.unfold``, a sliding
window over one dimension, is another op (:func:`~.judge.op_name`); so is an input without a
batch axis and, for ``fold``, a padding that differs between height and width.

``unfold`` is exported as moves alone (Pad with zeros, two Gathers, Transpose, Reshape), so
both runtimes give PyTorch's values bit for bit; ``fold`` is ONNX's Col2Im (opset 18), which
adds the overlapping windows as PyTorch's col2im does."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.shorthands import EXACT_FLOAT, FLOAT, both

__all__ = ["FOLD_ROWS"]

_TEST = "runtimes/test_fold_normalize.py"
_COL2IM = Rule(
    Verdict.BOUNDED,
    "float",
    "ONNX's Col2Im: a sum where windows overlap, in the kernel's order of its terms",
)
_UNFOLD_UNBATCHED = Rule(
    Verdict.KEPT,
    reason="the ONNX export assumes a batch axis: without one ONNX Runtime refuses its Pad "
    "('Pads has incorrect number of values') and OpenVINO's conversion fails",
)
_FOLD_UNBATCHED = Rule(
    Verdict.KEPT,
    reason="without a batch axis ONNX Runtime refuses Col2Im ('input must have rank 3')",
)
_FOLD_PADDING = Rule(
    Verdict.KEPT,
    reason="the ONNX export writes Col2Im's pads as (h, h, w, w) where ONNX reads (h_begin, "
    "w_begin, h_end, w_end): with a padding of (1, 0) it computes another fold",
)

FOLD_ROWS: tuple[OpRow, ...] = (
    OpRow("unfold", ("nn.functional.unfold",), both(EXACT_FLOAT)),
    OpRow("unfold(unbatched)", (), both(_UNFOLD_UNBATCHED), checked_by=_TEST),
    OpRow("fold", (), both(_COL2IM), checked_by=_TEST),
    OpRow(
        "fold(unbatched)",
        (),
        {"onnxruntime": (_FOLD_UNBATCHED,), "openvino": (FLOAT,)},
        checked_by=_TEST,
    ),
    OpRow("fold(unequal padding)", (), both(_FOLD_PADDING), checked_by=_TEST),
)
