"""Per-call index guards (:mod:`embedl_dynamo.graph.index_guards`): the guarded graph's last
output says when an index is outside the range PyTorch takes, in PyTorch and exported on ONNX
Runtime and OpenVINO, which otherwise wrap a negative index or read zeros past the end."""

from __future__ import annotations

import operator

import expecttest
import pytest
import torch
from torch import nn

from embedl_dynamo.errors import IndexGuardError
from embedl_dynamo.graph.index_guards import IndexCheck, guard_indices, index_checks
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import dynamo_frozen

T = torch.tensor
RUNTIMES = [
    OnnxRuntime,
    pytest.param(
        OpenVINORuntime,
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]


class _Pooled(nn.Module):
    """Token embeddings, pooled at each sequence's last token."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return h[torch.arange(h.shape[0]), lengths - 1]


def _feed(gm, values):
    """``values`` (by input name) in the order of ``gm``'s placeholders (Dynamo's ``l_x_``)."""
    return [values[n.name[2:-1]] for n in gm.graph.nodes if n.op == "placeholder"]


class TestGuard(expecttest.TestCase):
    def test_ids_and_last_positions_are_checked_and_the_folded_arange_is_not(self) -> None:
        ids, lengths = T([[1, 2, 3], [4, 5, 6]]), T([3, 0])
        gm, inputs = dynamo_frozen(_Pooled().eval(), ids, lengths)
        guard = guard_indices(gm)
        assert guard is not None
        self.assertExpectedInline(
            format_graph(guard.graph),
            """\
input l_ids_
input l_lengths_
lt = lt(l_ids_, 0)
ge = ge(l_ids_, 10)
int_1 = .int(lt)
int_2 = .int(ge)
add = add(int_1, int_2)
sum_1 = .sum(add)
h = embedding(l_ids_, $emb.weight, None, None, 2.0, False, False)
sub = sub(l_lengths_, 1)
size = .size(h, 1)
add_1 = add(sub, size)
lt_1 = lt(add_1, 0)
ge_1 = ge(sub, size)
int_3 = .int(lt_1)
int_4 = .int(ge_1)
add_2 = add(int_3, int_4)
sum_2 = .sum(add_2)
getitem = getitem(h, ($embedl_folded_0, sub))
add_3 = add(sum_1, sum_2)
ne = ne(add_3, 0)
return (getitem, ne)""",
        )
        assert guard.ops == ("embedding@emb", "getitem@getitem")
        assert index_checks(gm) == (
            IndexCheck("embedding@emb", True),
            IndexCheck("getitem@getitem", False, "the index is a constant within PyTorch's range"),
            IndexCheck("getitem@getitem", True),
        )
        # an empty sequence reads its own last token in PyTorch: in range, no flag
        out = guard.graph(*inputs)
        assert not out[-1] and torch.equal(guard.split(out)[0], gm(*inputs)[0])


def test_the_guard_leaves_the_other_outputs_and_the_input_graph_alone():
    model = _Pooled().eval()
    ids, lengths = T([[1, 2, 3], [4, 5, 6]]), T([3, 1])
    gm, inputs = dynamo_frozen(model, ids, lengths)
    before = format_graph(gm)
    guard = guard_indices(gm)
    out = guard.graph(*inputs)
    assert len(out) == 2 and out[-1].dtype == torch.bool and out[-1].shape == ()
    assert torch.equal(guard.split(out)[0], model(ids, lengths))
    assert format_graph(gm) == before


def test_split_raises_naming_the_ops():
    gm, inputs = dynamo_frozen(_Pooled().eval(), T([[1, 2]]), T([1]))
    guard = guard_indices(gm)
    with pytest.raises(IndexGuardError, match=r"outside the range PyTorch takes in embedding@emb"):
        guard.split((torch.zeros(1, 4), T(True)))
    assert isinstance(IndexGuardError("x"), ValueError)


def test_indices_the_graph_proves_in_range_get_no_guard():
    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Embedding(8, 4)
            self.register_buffer("rows", T([0, 7, 3]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
            return x + self.pos(positions), self.pos(self.rows), x[:, [0, -1, 2]]

    gm, _ = dynamo_frozen(Positions().eval(), torch.randn(2, 5, 4))
    assert guard_indices(gm) is None
    reasons = [(c.op, c.guarded, c.reason) for c in index_checks(gm)]
    assert reasons == [
        ("embedding@pos", False, "the index is a constant within PyTorch's range"),
        ("embedding@pos", False, "the index is a constant within PyTorch's range"),
        ("getitem@getitem", False, "the index is a constant within PyTorch's range"),
    ]


def test_a_0_d_tensor_is_one_element_along_dim_0():
    """PyTorch's gather, scatter and index_* ops take a 0-d tensor as one element along dim
    0, indices in [0, 1). The guard read ``shape[0]`` of it and failed the compile with an
    IndexError (gather and scatter of the conformance sweep's 0-d samples, every dtype)."""

    def f(x, i, j, k):
        return torch.gather(x, 0, i), torch.scatter_add(x, 0, j, x), torch.index_add(x, -1, k, x)

    for x in (T(2.0), T(True)):
        gm, inputs = dynamo_frozen(f, x, T([0, 0]), T(0), T([0]))
        guard = guard_indices(gm)
        assert [op.split("@")[0] for op in guard.ops] == ["gather", "scatter_add", "index_add"]
        nodes = guard.graph.graph.nodes
        assert not any(n.target == "size" for n in nodes)  # ``x.size(0)`` raises on a 0-d x
        assert [n.args[1] for n in nodes if n.target is operator.ge] == [1, 1, 1]  # i >= 1
        out = guard.graph(*inputs)
        assert not out[-1] and all(torch.equal(a, b) for a, b in zip(guard.split(out), f(*inputs)))


def test_a_dynamic_arange_that_may_pass_the_table_is_guarded_with_size_calls():
    """GPT-2 past ``n_positions``: with a symbolic length nothing proves the positions in
    range; the bound is a ``size`` call, so another length is checked against its own size."""

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Embedding(8, 4)

        def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return self.pos(torch.arange(x.shape[1])), x[i, i]

    gm, inputs = dynamo_frozen(Positions().eval(), torch.randn(3, 5), T([0, 1]), dynamic=True)
    guard = guard_indices(gm)
    assert [op.split("@")[0] for op in guard.ops] == ["embedding", "getitem"]
    assert sum(n.target == "size" for n in guard.graph.graph.nodes) >= 3
    x = torch.randn(6, 7)  # another size: x[-6, -6] is in range only against this one
    assert not guard.graph(*_feed(gm, {"x": x, "i": T([-6, 5])}))[-1]


def test_a_constant_list_a_symbolic_size_may_not_hold_is_guarded_as_a_tensor():
    def f(x):
        return x[:, [0, -4]] * 1, x[[0, 1], [-1, 2]]

    gm, _ = dynamo_frozen(f, torch.randn(3, 5), dynamic=True)
    checks = [(c.guarded, c.reason) for c in index_checks(gm)]
    assert checks == [
        (True, ""),
        (False, "the index is a constant within PyTorch's range"),
        (True, ""),
    ]  # [0, 1] < the rows, which are at least 2
    guard = guard_indices(gm)
    assert sum(n.target is torch.tensor for n in guard.graph.graph.nodes) == 2
    assert not guard.graph(torch.randn(4, 6))[-1]


class _IndexOps(nn.Module):
    """One of each index op a runtime computes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 3)

    def forward(self, x, ids, g, s, sel, fill, cp, tk, i, j):
        return (
            self.emb(ids),
            torch.gather(x, 1, g),
            x.scatter(1, s, 1.0),
            x.index_select(0, sel),
            x.index_fill(1, fill, 0.0),
            x.index_copy(0, cp, torch.ones(2, 5)),
            torch.take(x, tk),
            x[i, j],
            x[i],
        )


# valid indices at both ends of each range (negatives where PyTorch takes them)
VALID = {
    "x": torch.arange(20.0).view(4, 5),
    "ids": T([0, 5]),
    "g": T([[0, 4]] * 4),
    "s": T([[4]] * 4),
    "sel": T([3, 0]),
    "fill": T([-5, 4]),
    "cp": T([3, 0]),
    "tk": T([-20, 19]),
    "i": T([-4, 3]),
    "j": T([-5, 4]),
}
# one index outside PyTorch's range per call: below it, then at its end
INVALID = {
    "ids": (T([-1, 0]), T([6, 0])),
    "g": (T([[-1, 0]] * 4), T([[5, 0]] * 4)),
    "s": (T([[-1]] * 4), T([[5]] * 4)),
    "sel": (T([-1, 0]), T([4, 0])),
    "fill": (T([-6, 0]), T([5, 0])),
    "cp": (T([-1, 0]), T([4, 0])),
    "tk": (T([-21, 0]), T([20, 0])),
    "i": (T([-5, 0]), T([4, 0])),
    "j": (T([-6, 0]), T([5, 0])),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exported_guard_flags_each_index_pytorch_refuses(runtime, tmp_path):
    """Valid indices (negatives included) give PyTorch's outputs and no flag; an index PyTorch
    refuses sets the flag (ONNX Runtime may raise instead for one past the end: not silent)."""
    model = _IndexOps().eval()
    gm, _ = dynamo_frozen(model, *VALID.values())
    guard = guard_indices(gm)
    assert len(guard.ops) == 8
    built = runtime(Settings(cache_dir=tmp_path, num_threads=1)).build(
        guard.graph, _feed(gm, VALID)
    )
    with torch.no_grad():
        expected = model(*VALID.values())
    outputs = built(*_feed(gm, {**VALID, "i": T([-1, 0]), "j": T([-1, -5])}))
    assert not outputs[-1]
    assert torch.equal(guard.split(outputs)[-2], T([19.0, 0.0]))
    for e, a in zip(expected, guard.split(built(*_feed(gm, VALID)))):
        assert torch.equal(a, e)
    for name, values in INVALID.items():
        for value in values:
            try:
                flag = built(*_feed(gm, {**VALID, name: value}))[-1]
            except Exception:  # noqa: BLE001 - ONNX Runtime refuses it itself: not silent
                assert runtime is OnnxRuntime, (name, value)
                continue
            assert flag, (name, value)


def test_an_arange_over_the_dimension_it_indexes_gets_no_guard():
    """With a dynamic batch the ``arange`` is no constant: it is proved in range as an arange."""

    class Rows(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[torch.arange(x.shape[0]), 0]

    gm, _ = dynamo_frozen(Rows().eval(), torch.randn(3, 5), dynamic=True)
    reasons = [(c.guarded, c.reason) for c in index_checks(gm)]
    assert reasons == [(False, "the index is an arange within PyTorch's range")]
