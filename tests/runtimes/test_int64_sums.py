"""int64 sums on OpenVINO, which computes int64 as int32 (issue 50, section 2.3): its guard
keeps inputs within [-2**30, 2**30), so the sum of two fits; a sum the graph cannot bound
within int32 is the row ``add(int64 past int32)``, kept in PyTorch there and exact on ONNX
Runtime (:mod:`embedl_dynamo.runtimes.conformance.int_bounds`)."""

from __future__ import annotations

import warnings

import pytest
import torch

from embedl_dynamo import last_report
from embedl_dynamo.errors import CallRefused
from embedl_dynamo.runtimes.conformance import op_name
from embedl_dynamo.runtimes.conformance.int_bounds import value_range
from embedl_dynamo.runtimes.openvino.int_range import check_int32_range
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import compile_on

needs_openvino = pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino")
EDGE = torch.tensor([2**30 - 1, -(2**30)])


def _dynamo_graph(fn, *inputs):
    """``fn``'s Dynamo graph, with the example values the judge reads."""
    graphs = []

    def capture(gm, _):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, dynamic=False)(*inputs)
    return graphs[0]


def _sums(fn, *inputs) -> list[tuple[str, tuple[int, int] | None]]:
    """(the table's name, the range) of each sum in ``fn``'s graph, in order."""
    gm = _dynamo_graph(fn, *inputs)
    return [
        (op_name(n), value_range(n))
        for n in gm.graph.nodes
        if (op_name(n) or "").startswith(("add", "sub"))
    ]


def test_a_sum_of_two_inputs_fits_and_a_third_term_does_not():
    a = torch.tensor([1, 2])
    assert _sums(lambda x, y, z: x + y + z, a, a, a) == [
        ("add", (-(2**31), 2**31 - 2)),
        ("add(int64 past int32)", (-3 * 2**30, 3 * 2**30 - 3)),
    ]


def test_sizes_constants_aranges_and_masks_bound_a_sum():
    """The sums of a decoder's positions: an arange offset by a size, a running sum of a
    mask, and a small constant, each within int32."""
    ids = torch.ones(2, 5, dtype=torch.int64)

    def positions(ids):
        mask = ids.ne(0).int()
        running = torch.cumsum(mask, 1).type_as(mask) * mask
        return running.long() + 1, torch.arange(ids.shape[1]) + ids.shape[1], ids - 7

    assert _sums(positions, ids) == [
        ("add", (1, 6)),
        ("add", (5, 10)),
        ("sub", (-(2**30) - 7, 2**30 - 8)),
    ]


def test_no_match_without_a_bound():
    """A float made int64 has no bound (1e10 is a valid value), and neither has a constant
    past int32: both sums are the other row."""
    x = torch.tensor([1.0, 2.0])
    assert _sums(lambda x: x.long() + 1, x) == [("add(int64 past int32)", None)]
    assert _sums(lambda i: i + 2**31, torch.tensor([1])) == [
        ("add(int64 past int32)", (2**31 - 2**30, 2**31 + 2**30 - 1))
    ]


def test_the_guard_refuses_a_dimension_the_bound_does_not_cover():
    """Symbolic sizes are bounded by the guard on the inputs' dimensions (an expanded tensor
    has the size without the memory)."""
    check_int32_range([torch.zeros(1).expand(2**30 - 1)])
    with pytest.raises(CallRefused, match="dimension of 2\\*\\*30 or more"):
        check_int32_range([torch.zeros(1).expand(2**30)])


CHAINS = {
    "three_inputs": (lambda a, b, c: a + b + c, 3),
    "doubled_twice": (lambda a: (a + a) + (a + a), 1),
    "step_and_input": (lambda a: a - (-(2**30)) + a, 1),
    "in_place": (lambda a: a.clone().add_(a).add_(a), 1),
}


@needs_openvino
@pytest.mark.parametrize("case", CHAINS)
def test_openvino_sums_past_int32_do_not_wrap_on_a_later_call(case):
    """2**30 - 1 three times gave -1073741827 on OpenVINO: such sums stay in PyTorch."""
    fn, count = CHAINS[case]
    compiled = compile_on(fn, "openvino", fallback="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(
            compiled(*[torch.tensor([1, 2])] * count), fn(*[torch.tensor([1, 2])] * count)
        )
        assert torch.equal(compiled(*[EDGE] * count), fn(*[EDGE] * count))
    reasons = [r.reason for r in last_report().subgraphs]
    reasons += [k["reason"] for r in last_report().subgraphs for k in r.kept]
    assert any("int64 past int32" in reason for reason in reasons), reasons


@needs_openvino
def test_openvino_takes_a_sum_of_two_inputs():
    fn = lambda a, b: torch.cat([a + b, a - b])  # noqa: E731
    compiled = compile_on(fn, "openvino")
    assert torch.equal(compiled(EDGE, EDGE), fn(EDGE, EDGE))
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report


def test_onnxruntime_takes_the_sums_openvino_keeps():
    fn, count = CHAINS["three_inputs"]
    compiled = compile_on(fn, "onnxruntime")
    big = torch.tensor([2**62, -(2**61)])
    assert torch.equal(compiled(*[big] * count), fn(*[big] * count))
    (report,) = last_report().subgraphs
    assert report.runtime == "onnxruntime", report


@needs_openvino
def test_openvino_keeps_any_op_that_makes_int64_values_past_int32():
    """``where`` choosing a constant past int32 computes no sum, yet would wrap on OpenVINO."""
    fn = lambda m, x: torch.where(m, torch.full_like(x, 2**40), x)  # noqa: E731
    compiled = compile_on(fn, "openvino", fallback="eager")
    x = torch.tensor([1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mask in (torch.tensor([False, False]), torch.tensor([True, False])):
            assert torch.equal(compiled(mask, x), fn(mask, x))
    reasons = [r.reason for r in last_report().subgraphs]
    reasons += [k["reason"] for r in last_report().subgraphs for k in r.kept]
    assert any("past the int32" in reason for reason in reasons), reasons


def test_a_comparison_with_one_side_within_2_24_is_its_own_row():
    """A decoder's causal mask compares positions the graph bounds (an arange, a size), and a
    padding mask compares token ids with a small constant: exact through float32, where the
    small side is held exactly and every other integer rounds onto itself or past 2**24 on
    its side, so OpenVINO takes them. Two inputs' integers, bounded only by the guard past
    2**24, and a constant of 2**24 itself keep their rows (no match, the reason OV_COMPARE
    says); so does a float operand."""
    ids = torch.ones(2, 5, dtype=torch.int64)

    def mask(ids):
        positions = torch.arange(ids.shape[1])
        return (
            positions[None, :] <= positions[:, None],
            ids >= 3,
            ids.ne(2**24 - 1),
            ids > ids.flip(0),
            ids == 2**24,
            ids < 2.5,
        )

    gm = _dynamo_graph(mask, ids)
    names = [op_name(n) or "" for n in gm.graph.nodes]
    names = [n for n in names if n.split("(")[0] in ("le", "ge", "ne", "gt", "eq", "lt")]
    assert names == [
        "le(one side within 2**24)",
        "ge(one side within 2**24)",
        "ne(one side within 2**24)",
        "gt",
        "eq",
        "lt",
    ]


@needs_openvino
def test_openvino_takes_a_comparison_of_bools():
    """LongT5's ``mask_a > mask_b`` of two bool masks: 0 and 1, exact through float32 (it was
    kept by the integer rule)."""

    def fn(x, ids):
        return (x > 0) > (ids == 1), (x > 0) <= (ids > 1)

    compiled = compile_on(fn, "openvino")
    x, ids = torch.randn(4, 6), torch.randint(0, 3, (4, 6), dtype=torch.int8)
    for got, expected in zip(compiled(x, ids), fn(x, ids), strict=True):
        assert torch.equal(got, expected)
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report


@needs_openvino
def test_openvino_takes_a_bounded_comparison_and_keeps_an_unbounded_one():
    def fn(x, ids):
        positions = torch.arange(x.shape[1])
        causal = (positions[None, :] <= positions[:, None]).float()
        return x @ causal, ids > 16777216

    compiled = compile_on(fn, "openvino", fallback="eager")
    x, ids = torch.randn(2, 4), torch.tensor([16777217, 16777216])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, expected = compiled(x, ids), fn(x, ids)
    torch.testing.assert_close(got[0], expected[0])
    assert torch.equal(got[1], expected[1])  # through float32: 16777217 > 16777216 is False
    (report,) = last_report().subgraphs
    kept = [k["op"] for k in report.kept]
    assert kept == ["gt"], report


def test_the_indices_torch_where_returns_have_no_range_from_its_condition():
    """``torch.where(mask)`` gives positions, not the condition's 0 and 1: no range."""
    root = torch.nn.Module()
    root.register_buffer("mask", torch.tensor([True, False, True]))
    graph = torch.fx.Graph()
    mask = graph.get_attr("mask")
    positions = graph.call_function(torch.where, (mask,))
    chosen = graph.call_function(torch.where, (mask, 5, 2))
    graph.output((positions, chosen))
    torch.fx.GraphModule(root, graph)  # the graph's owning module holds the constant
    assert value_range(mask) == (0, 1)
    assert value_range(positions) is None and value_range(chosen) == (0, 5)


def _arithmetic(ids):
    positions = torch.arange(ids.shape[1])
    relative = positions[None, :] - positions[:, None]
    nearer = -torch.min(relative, torch.zeros_like(relative))
    return relative.abs(), torch.sign(relative), (relative > 0).long() * 16, nearer, ids * 3


def test_int64_arithmetic_the_graph_bounds_within_int32_is_its_own_row():
    """T5's relative-position buckets: ``abs``, ``sign``, ``neg`` and products of positions
    the graph bounds, each within int32, so OpenVINO's int32 computes them exactly. An input
    times 3 may leave int32 (the guard lets it reach 2**30): that product keeps its row."""
    gm = _dynamo_graph(_arithmetic, torch.ones(2, 5, dtype=torch.int64))
    names = [op_name(n) or "" for n in gm.graph.nodes]
    rows = [n for n in names if n.startswith(("abs", "sign", "mul", "neg"))]
    assert rows == [
        "neg(within int32)",
        "abs(within int32)",
        "sign(within int32)",
        "mul(within int32)",
        "mul",
    ]


def test_max_with_a_dim_gives_indices_and_no_range_of_its_input():
    """``torch.max(x, 1)`` takes a dim, not a second tensor: its indices are no values of x."""
    gm = _dynamo_graph(lambda x: torch.max(x * 0 + 2**40, 1)[1] + 1, torch.ones(2, 3).long())
    (node,) = [n for n in gm.graph.nodes if op_name(n) == "max"]
    assert value_range(node) is None


@needs_openvino
def test_openvino_computes_bounded_int64_arithmetic_at_the_guards_edges():
    def fn(ids):
        return torch.stack([ids.abs(), ids.sign(), -ids, (ids.sign() > 0).long() * 16])

    compiled = compile_on(fn, "openvino")
    for ids in (torch.tensor([3, -4]), EDGE):
        assert torch.equal(compiled(ids), fn(ids))
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report


def _clamped_mask(mask: torch.Tensor) -> torch.Tensor:
    """Longformer's ``torch.clamp(attention_mask, min=0, max=1)`` of an int64 mask of 0, 1, 2."""
    return torch.clamp(mask, min=0, max=1) * 5


def test_a_clamp_the_graph_bounds_within_int32_is_its_own_row():
    """An int64 input clamped to [0, 1] stays within int32 (the guard keeps the input there
    too); a bound past int32 keeps the clamp's row."""
    gm = _dynamo_graph(
        lambda m: (_clamped_mask(m), torch.clamp(m, max=2**40)), torch.ones(2, 4).long()
    )
    names = [op_name(n) or "" for n in gm.graph.nodes]
    assert [n for n in names if n.startswith("clamp")] == ["clamp(within int32)", "clamp"]


@needs_openvino
def test_openvino_clamps_an_int64_mask_at_the_guards_edges():
    compiled = compile_on(_clamped_mask, "openvino")
    for mask in (torch.tensor([[0, 1, 2, 1]]), torch.tensor([[2**30 - 1, -(2**30), 7, 0]])):
        assert torch.equal(compiled(mask), _clamped_mask(mask))
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report


def _position_ids(ids: torch.Tensor) -> torch.Tensor:
    """M2M100's and RoBERTa's position ids from token ids: a padding mask, its running sum
    (int64 from int32), a product of int32s."""
    mask = ids.ne(1).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask + 1


def test_a_running_sum_and_an_int32_product_the_graph_bounds_are_their_own_rows():
    """The running sum of a 0/1 mask is bounded by its axis' size and the product by that
    times 1: within int32, so OpenVINO's int32 computes them exactly. A running sum of the
    ids themselves may pass int32 (16 terms up to 2**30): it keeps its row."""
    gm = _dynamo_graph(
        lambda ids: (_position_ids(ids), torch.cumsum(ids, 1)), torch.ones(2, 16).long()
    )
    names = [op_name(n) or "" for n in gm.graph.nodes]
    rows = [n for n in names if n.startswith(("ne", "cumsum", "mul"))]
    assert rows == [
        "ne(one side within 2**24)",
        "cumsum(within int32)",
        "mul(within int32)",
        "cumsum",
    ]


@needs_openvino
def test_openvino_computes_position_ids_from_token_ids_at_the_guards_edges():
    compiled = compile_on(_position_ids, "openvino")
    ids = torch.tensor([[5, 1, 2**24 + 1, 1, 2**30 - 1, -(2**30), 1, 2**24 - 1]])
    for call in (ids, ids.flip(1), torch.ones_like(ids)):
        assert torch.equal(compiled(call), _position_ids(call))
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report


def _last_tokens(ids: torch.Tensor) -> torch.Tensor:
    """mBART's ``shift_tokens_right``: the count of non-padding tokens (a bool sum), the last
    one's position, its token gathered."""
    last = (ids.ne(1).sum(dim=1) - 1).unsqueeze(-1)
    return ids.gather(1, last.clamp(min=0)).squeeze(-1)


def test_a_sum_of_a_mask_is_its_own_row_and_a_sum_of_ids_keeps_its_row():
    gm = _dynamo_graph(lambda ids: (_last_tokens(ids), ids.sum(1)), torch.ones(2, 16).long())
    names = [op_name(n) or "" for n in gm.graph.nodes]
    assert [n for n in names if n.startswith("sum")] == ["sum(within int32)", "sum"]


@needs_openvino
def test_openvino_finds_the_last_tokens_at_the_guards_edges():
    compiled = compile_on(_last_tokens, "openvino")
    ids = torch.tensor([[5, 2**30 - 1, -(2**30), 1, 1], [2**24 + 1, 1, 1, 1, 1]])
    for call in (ids, ids.flip(0), torch.ones_like(ids)):
        assert torch.equal(compiled(call), _last_tokens(call))
    (report,) = last_report().subgraphs
    assert report.runtime == "openvino" and not report.kept, report
