"""The conformance table (:mod:`embedl_dynamo.runtimes.conformance`) as the compile and the
docs read it; the suite that checks its rows is ``test_conformance.py``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import fx

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import (
    OPINFO_ALIASES,
    ROWS,
    STRUCTURAL,
    Rule,
    Verdict,
    differences,
    kept_in_pytorch,
    op_name,
    rule_for,
)
from tests.runtimes.conformance_check import compile_on
from tools.op_conformance_doc import PAGE, markdown_table, render

TESTS = Path(__file__).resolve().parents[1]


def test_the_docs_page_shows_the_table():
    page = PAGE.read_text()
    assert render(page) == page, "run: python -m tools.op_conformance_doc"
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


def test_an_op_without_a_row_stays_in_pytorch_naming_it():
    """The table is an allow-list judged per node: ``cosh`` has no row, so it stays in PyTorch
    on either CPU runtime, named in the report and one warning, while the rest of its graph
    (the ``+ 1``) still runs on the runtime (before: the whole graph stayed in PyTorch)."""
    x = torch.randn(3, 4)
    for runtime in ("onnxruntime", "openvino"):
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = compile_on(lambda t: torch.cosh(t) + 1, runtime, fallback="eager")(x)
        assert torch.equal(out, torch.cosh(x) + 1)
        (sub,) = last_report().subgraphs
        expected = f"cosh on torch.float32 has no conformance row for {runtime}; runs in PyTorch"
        assert sub.status == "partitioned" and sub.runtime == runtime, sub
        assert [(k["op"], k["reason"]) for k in sub.kept] == [("cosh", expected)]
        assert [p.runtime for p in sub.partitions] == [runtime]
        assert sum(expected in str(w.message) for w in caught) == 1


def test_a_row_for_floats_only_keeps_an_integer_input():
    gm = fx.symbolic_trace(lambda x: torch.rsqrt(x))
    for node in gm.graph.nodes:  # what the compile's shape propagation records
        node.meta["val"] = torch.empty(2, dtype=torch.int64)
    reason = kept_in_pytorch(gm, ["onnxruntime"])
    assert reason == "rsqrt on torch.int64 has no conformance row for onnxruntime; runs in PyTorch"
    for node in gm.graph.nodes:
        node.meta["val"] = torch.empty(2)
    assert kept_in_pytorch(gm, ["onnxruntime", "openvino"]) is None


def test_runtimes_the_table_does_not_speak_for_are_not_judged():
    gm = fx.symbolic_trace(lambda x: torch.cosh(x))
    assert kept_in_pytorch(gm, ["tensorrt"]) is None
    assert "no conformance row for openvino" in kept_in_pytorch(gm, ["tensorrt", "openvino"])


def test_picking_an_output_is_not_judged_but_indexing_a_tensor_is():
    gm = fx.symbolic_trace(lambda x: torch.max(x, 1)[0][1:])
    picks = [n for n in gm.graph.nodes if n.op == "call_function" and "getitem" in n.name]
    picks[0].args[0].meta["val"] = (torch.empty(2), torch.empty(2, dtype=torch.int64))
    picks[1].args[0].meta["val"] = torch.empty(2)
    assert [op_name(n) for n in picks] == [None, "getitem"]


def test_every_row_is_checked_by_samples_or_is_structural():
    for row in ROWS:
        if row.opinfo:
            continue
        assert row.checked_by, f"{row.op}: no OpInfo entry and no checked_by"
        assert row.checked_by == STRUCTURAL or (TESTS / row.checked_by).is_file(), row


def test_an_embedding_with_max_norm_is_another_op():
    """``max_norm`` rescales the weight's rows first (``embedding_renorm_``), which the
    runtimes' export leaves out: the row of ``embedding`` does not speak for it."""
    weight = torch.randn(5, 3)
    plain = fx.symbolic_trace(lambda i: torch.nn.functional.embedding(i, weight))
    renorm = fx.symbolic_trace(lambda i: torch.nn.functional.embedding(i, weight, max_norm=1.0))
    assert kept_in_pytorch(plain, ["onnxruntime"]) is None
    reason = kept_in_pytorch(renorm, ["onnxruntime"])
    assert reason is not None and reason.startswith("embedding_renorm_ has no conformance row")


def test_the_readme_counts_the_tables_rules():
    """The README's summary of the table (rules by dtype class, per runtime) is the table's."""
    from collections import Counter

    readme = (TESTS.parent / "README.md").read_text()
    for runtime, label in (("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO")):
        counted = Counter(rule.verdict for row in ROWS for rule in row.rules.get(runtime, ()))
        cells = [counted[Verdict.EXACT], counted[Verdict.BOUNDED], counted[Verdict.KEPT]]
        assert f"| {label} | {' | '.join(map(str, cells))} |" in readme, (runtime, cells)
    assert f"the [op conformance table](docs/op-conformance.md) ({len(ROWS)} ops" in readme


def _recorded_names(fn, *args) -> list[str | None]:
    """The table's names of the calls Dynamo records for ``fn`` (with its value metadata)."""
    names: list[str | None] = []

    def backend(gm, inputs):
        names.extend(op_name(n) for n in gm.graph.nodes if n.op.startswith("call"))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return [n for n in names if n is not None]


def test_an_op_is_named_by_the_computation_its_arguments_make():
    """``pad`` and ``interpolate`` by mode, a cast of floats to integers, ``~`` of a bool,
    ``softplus`` with another threshold, and a Tensor method as its torch function: each
    another row (before, every mode of ``pad`` shared one row and a method ignored
    ``rounding_mode``)."""
    f = torch.nn.functional
    x = torch.randn(1, 2, 4, 4)
    relu6 = torch.nn.ReLU6()
    names = _recorded_names(
        lambda t: (
            f.pad(t, (1, 1)),
            f.pad(t, (1, 1, 1, 1), mode="reflect"),
            f.interpolate(t, scale_factor=2.0),
            f.interpolate(t, scale_factor=2.0, mode="bilinear", antialias=True),
            t.long(),
            t.to(torch.float16),
            (t > 0).long(),
            ~(t > 0),
            f.softplus(t),
            f.softplus(t, 1.0, 5.0),
            t.div(2, rounding_mode="floor"),
            t.div(t, rounding_mode="floor"),
            relu6(t),
        ),
        x,
    )
    assert names == [
        "pad",
        "pad(mode='reflect')",
        "interpolate(mode='nearest')",
        "interpolate(mode='bilinear', antialias=True)",
        "float_to_int",
        "to",
        "gt",
        "long",
        "gt",
        "logical_not",
        "softplus",
        "softplus(threshold=5.0)",
        "floordiv_by_number",
        "div(rounding_mode='floor')",
        "hardtanh",
    ]


def test_an_alias_is_judged_as_its_op_with_the_ops_specialisations():
    """``torch.multiply`` (ConvBERT's) had no row and kept its graph's part in PyTorch; an
    alias is its op, and an 8-bit ``subtract`` is ``sub(8-bit)`` as ``sub`` is."""
    x = torch.randn(2, 3)
    small = torch.tensor([250, 3], dtype=torch.uint8)
    names = _recorded_names(
        lambda t, u: (
            torch.multiply(t, 2),
            t.clip(0, 1),
            torch.special.expit(t),
            torch.greater(t, 0),
            torch.subtract(u, u),
        ),
        x,
        small,
    )
    assert names == ["mul", "clamp", "sigmoid", "gt", "sub(8-bit)"]


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_aliases_run_on_the_runtime_as_their_ops(runtime: str):
    def aliases(t: torch.Tensor) -> torch.Tensor:
        return torch.special.expit(torch.multiply(t, 3).clip(-1, 2)) + torch.subtract(t, 1)

    x = torch.randn(4, 8)
    torch._dynamo.reset()
    got = compile_on(aliases, runtime)(x)
    torch.testing.assert_close(got, aliases(x), rtol=1e-6, atol=1e-6)
    assert last_report().subgraphs[0].runtime == runtime


@pytest.mark.slow
def test_the_aliases_are_opinfos_for_every_op_with_a_row():
    from torch.testing._internal.common_methods_invocations import op_db

    row_ops = {name: row.op for row in ROWS for name in row.opinfo}
    listed = {
        function.__name__: row_ops[info.name]
        for info in op_db
        if info.name in row_ops
        for alias in info.aliases
        for function in (alias.op, alias.method_variant)
        if function is not None
    }
    named = {n for row in ROWS for n in (row.op, *row.aliases)}
    assert {a: op for a, op in listed.items() if a not in named} == OPINFO_ALIASES


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_tensor_split_runs_where_its_form_converts(runtime: str):
    """EVA-02 splits into sections (exact on both runtimes); a split at a list of indices is
    another row, which OpenVINO's frontend cannot convert (kept there, with the reason)."""

    def split(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = (*t[:, :10].tensor_split(3, dim=-1), *torch.tensor_split(t, (1, 5), dim=1))
        return tuple(p * 2 for p in parts)

    x = torch.randn(4, 12)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compile_on(split, runtime, fallback="eager")(x)
    assert all(torch.equal(g, e) for g, e in zip(got, split(x), strict=True))
    names = _recorded_names(split, x)
    assert [n for n in names if n.startswith("tensor_split")] == [
        "tensor_split",
        "tensor_split(indices)",
    ]
    (report,) = last_report().subgraphs
    kept = [(k["op"], k["reason"].split(" on ")[0]) for k in report.kept]
    assert kept == ([] if runtime == "onnxruntime" else [("tensor_split", "tensor_split(indices)")])


def test_an_index_op_on_a_0_d_tensor_and_a_scatter_with_reduce_are_other_ops():
    """The export has no form of either (the runtimes refuse a 0-d GatherElements, neither
    exporter takes ``reduce``): each is its own row, kept in PyTorch with the reason, where the
    0-d form failed inside the compile before and a reduce failed its build."""
    x, i = torch.tensor(2.0), torch.tensor([0])
    names = _recorded_names(
        lambda t, j: (
            torch.gather(t, 0, j),
            torch.index_add(t, 0, j, t),
            torch.gather(t.reshape(1), 0, j),
            torch.scatter(t.reshape(1, 1), 1, j.reshape(1, 1), 3.0, reduce="multiply"),
        ),
        x,
        i,
    )
    assert names == [
        "gather(0-d)",
        "index_add(0-d)",
        "reshape",
        "gather",
        "reshape",
        "reshape",
        "scatter(reduce='multiply')",
    ]
    for op in ("gather(0-d)", "scatter(reduce='multiply')"):
        assert rule_for(op, "onnxruntime", torch.float32).verdict is Verdict.KEPT
    assert rule_for("index_add", "openvino", torch.bool).verdict is Verdict.KEPT
    assert rule_for("index_add", "openvino", torch.int64).verdict is Verdict.EXACT


def test_true_division_of_integers_runs_on_both_runtimes():
    """DeBERTa's relative positions divide int64 tensors (a float32 quotient): exact on ONNX
    Runtime, within the bound on OpenVINO (its quotient may differ in the last bit)."""
    for op in ("truediv", "div"):
        assert rule_for(op, "onnxruntime", torch.int64).verdict is Verdict.EXACT
        assert rule_for(op, "openvino", torch.int32).verdict is Verdict.BOUNDED
        assert rule_for(op, "openvino", torch.float32).verdict is Verdict.BOUNDED


def test_a_bool_rule_comes_before_the_integer_rule():
    assert rule_for("any", "onnxruntime", torch.bool).verdict is Verdict.EXACT
    assert rule_for("any", "onnxruntime", torch.int64).verdict is Verdict.KEPT
    assert rule_for("logical_not", "openvino", torch.bool).verdict is Verdict.EXACT
    assert rule_for("logical_not", "openvino", torch.int32).verdict is Verdict.KEPT
    assert not Rule(Verdict.EXACT, "bool").covers(torch.uint8)
    with pytest.raises(ValueError, match="use one of"):
        Rule(Verdict.EXACT, "int8")


# the ops whose missing rows kept whole models in PyTorch (issue 50), with an input dtype
_ISSUE_50_OPS = {
    torch.float32: (
        "avg_pool2d",
        "avg_pool1d",
        "pad",
        "pad(mode='reflect')",
        "pad(mode='replicate')",
        "conv1d",
        "conv_transpose1d",
        "conv_transpose2d",
        "interpolate(mode='nearest')",
        "interpolate(mode='bilinear')",
        "group_norm",
        "instance_norm",
        "layer_norm",
        "leaky_relu",
        "hardtanh",
        "relu6",
        "elu",
        "mish",
        "prelu",
        "pixel_shuffle",
        "repeat",
        "ones",
        "new_zeros",
        "new_full",
        "full",
        "norm",
        "linalg_vector_norm",
        "addcmul",
        "abs",
        "detach",
        "lerp",
        "nan_to_num",
        "clamp_min",
        "clamp_max",
        "scatter_add",
        "remainder",
        "fmod",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "softplus",
        "hardswish",
        "hardsigmoid",
        "exp",
        "mean",
        "var",
        "std",
        "where",
        "cumsum",
        "matmul",
        "bmm",
        "linear",
        "baddbmm",
        "to",
        "type_as",
    ),
    torch.int64: ("mul", "remainder", "fmod", "neg", "abs", "cumsum"),
    torch.bool: ("logical_not", "bitwise_not", "invert", "long", "int", "to", "any", "all"),
}


def test_the_ops_of_issue_50_run_on_onnx_runtime():
    """Each has a row, and ONNX Runtime computes it (exact or bounded) for that dtype; on
    OpenVINO each has a row too (``kept`` where it computes integers otherwise)."""
    for dtype, ops in _ISSUE_50_OPS.items():
        for op in ops:
            rule = rule_for(op, "onnxruntime", dtype)
            assert rule is not None and rule.verdict is not Verdict.KEPT, (op, dtype, rule)
            assert rule_for(op, "openvino", dtype) is not None, (op, dtype)


def test_an_op_on_an_empty_tensor_stays_in_pytorch():
    """OpenVINO ended the process (SIGFPE) on ``x[0:3, 1]`` of a (0, 5, 5) tensor, and ONNX
    Runtime on a group_norm of a batch of 0 beside another: any op reading or making a tensor
    with a size of 0 is ``empty_tensor``, which both runtimes keep in PyTorch."""
    names = _recorded_names(lambda t: (t[0:3, 1] + 1, t.sum()), torch.randn(0, 5, 5))
    assert names == ["empty_tensor", "empty_tensor", "empty_tensor"]
    assert _recorded_names(lambda t: t[0:3, 1] + 1, torch.randn(2, 5, 5)) == ["getitem", "add"]
    for runtime in ("onnxruntime", "openvino"):
        rule = rule_for("empty_tensor", runtime, torch.float32)
        assert rule.verdict is Verdict.KEPT and "SIGFPE" in rule.reason
