"""The conformance table (:mod:`embedl_dynamo.runtimes.conformance`) as the compile and the
docs read it; the suite that checks its rows is ``test_conformance.py``."""

from __future__ import annotations

import torch
from torch import fx

from bench.op_conformance_doc import PAGE, markdown_table, render
from embedl_dynamo.runtimes.conformance import (
    ROWS,
    Verdict,
    differences,
    kept_in_pytorch,
    rule_for,
)


def test_the_docs_page_shows_the_table():
    page = PAGE.read_text()
    assert render(page) == page, "run: python -m bench.op_conformance_doc"
    assert "| `topk` |" in page


def test_rules_pick_by_dtype():
    assert rule_for("sum", "openvino", torch.int64).verdict is Verdict.KEPT
    assert rule_for("sum", "openvino", torch.float32).verdict is Verdict.BOUNDED
    assert rule_for("sum", "onnxruntime", torch.int32).verdict is Verdict.EXACT
    assert rule_for("argmax", "openvino", torch.float32).verdict is Verdict.EXACT
    assert rule_for("no_such_op", "openvino", torch.float32) is None
    assert rule_for("softmax", "onnxruntime", torch.int64) is None  # a float-only row


def test_a_graph_with_a_kept_op_names_it_and_the_reason():
    gm = fx.symbolic_trace(lambda x: torch.topk(x * 2, 2))
    reason = kept_in_pytorch(gm, ["onnxruntime"])
    assert reason is not None and "topk" in reason and "tied values" in reason
    assert kept_in_pytorch(fx.symbolic_trace(lambda x: torch.argmax(x, 1)), ["openvino"]) is None


def test_an_unknown_dtype_is_kept_where_any_dtype_is():
    gm = fx.symbolic_trace(lambda x: x.sum(0))  # no metadata: the dtype is unknown
    assert kept_in_pytorch(gm, ["openvino"]) is not None
    assert kept_in_pytorch(gm, ["onnxruntime"]) is None


def test_every_row_has_a_rule_per_runtime_and_reasons_for_kept():
    for row in ROWS:
        for runtime in ("onnxruntime", "openvino"):
            assert row.rules.get(runtime), f"{row.op} has no rule for {runtime}"
            assert all(r.reason for r in row.rules[runtime] if r.verdict is Verdict.KEPT)
    assert differences("relu", "openvino") and not differences("relu", "onnxruntime")
    assert "Known differences" in markdown_table()
