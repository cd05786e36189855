"""The conformance table's rows for recurrent layers: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN``
(``tanh`` and ``relu``), which Dynamo records as one call of ``torch.lstm``, ``torch.gru``,
``torch.rnn_tanh`` or ``torch.rnn_relu`` on the input, the initial state and the flat list of
weights, once ``torch._dynamo.config.allow_rnn`` is set (by default Dynamo leaves these
modules out of its graph). The export lowers each to ONNX's ``LSTM``/``GRU``/``RNN`` node, one
per layer, both directions in one node. An LSTM with ``proj_size``, an input of another
dtype than float32, and a layer beside another one (neither feeding the other, both computed
from one graph input) are other ops (:func:`~.judge.op_name`). See the package's docstring for
the verdicts."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import Difference, OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.shorthands import FLOAT, both, non_finite

__all__ = ["RECURRENT_OPS", "RECURRENT_ROWS"]

#: the ops Dynamo records for the recurrent layers
RECURRENT_OPS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
_TEST = "runtimes/test_recurrent.py"
_ORT_LSTM_NAN = (
    "a NaN in the input or the initial state gives numbers where PyTorch gives NaN (ONNX "
    "Runtime's LSTM)"
)
_ORT_GRU = (
    "a NaN in the input, or a NaN or an infinity in the initial state, gives numbers where "
    "PyTorch gives NaN (ONNX Runtime's GRU)"
)
_RELU_NON_FINITE = (
    "a NaN or an infinity in the input or the initial state gives infinities or numbers where "
    "PyTorch's relu recurrence gives NaN"
)
_PROJ = Rule(
    Verdict.KEPT,
    reason="the ONNX export refuses an LSTM with proj_size ('LSTMs with projections'): ONNX's "
    "LSTM has no projection",
)
_OTHER_DTYPE = Rule(
    Verdict.KEPT,
    reason="float32 only: bfloat16 fails to build on both runtimes, float16 comes back beyond "
    "the bound on both, and float64 has no kernel in ONNX Runtime and is computed as float32 "
    "by OpenVINO",
)

_BESIDE = Rule(
    Verdict.KEPT,
    reason="OpenVINO computes one of two recurrent layers wrong where both read one input tensor, "
    "or two it merges into one (relu(x) twice), and one of them runs in one direction only: "
    "kept where neither feeds the other and both inputs come from one graph input (each alone, "
    "both bidirectional, one after the other, or on inputs of their own, it computes right)",
)

RECURRENT_ROWS: tuple[OpRow, ...] = (
    OpRow(
        "lstm",
        (),
        both(FLOAT),
        differs=(Difference("onnxruntime", "nan", _ORT_LSTM_NAN),),
        checked_by=_TEST,
    ),
    OpRow("gru", (), both(FLOAT), differs=non_finite(_ORT_GRU, ("onnxruntime",)), checked_by=_TEST),
    OpRow("rnn_tanh", (), both(FLOAT), checked_by=_TEST),
    OpRow("rnn_relu", (), both(FLOAT), differs=non_finite(_RELU_NON_FINITE), checked_by=_TEST),
    OpRow("lstm(proj_size)", (), both(_PROJ), checked_by=_TEST),
    *(
        OpRow(f"{op}(not float32)", (), both(_OTHER_DTYPE), checked_by=_TEST)
        for op in RECURRENT_OPS
    ),
)
#: beside another one: as each op's row on ONNX Runtime, kept on OpenVINO
RECURRENT_ROWS = (
    *RECURRENT_ROWS,
    *(
        OpRow(
            f"{row.op}(beside another)",
            (),
            {"onnxruntime": row.rules["onnxruntime"], "openvino": (_BESIDE,)},
            differs=tuple(d for d in row.differs if d.runtime == "onnxruntime"),
            checked_by=_TEST,
        )
        for row in RECURRENT_ROWS[:4]
    ),
)
