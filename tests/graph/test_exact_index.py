"""Indexing with several index tensors, each made non-negative first
(:mod:`embedl_dynamo.graph.exact_index`): PyTorch's elements in PyTorch, and, exported, on ONNX
Runtime and OpenVINO, where the TorchScript exporter's flat index read a negative one wrong."""

from __future__ import annotations

import expecttest
import pytest
import torch

from embedl_dynamo.graph.exact_index import exact_getitem, exact_setitem
from embedl_dynamo.graph.exact_ops import exact_lowering
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import dynamo_frozen

X = torch.arange(60.0).view(3, 4, 5)
T = torch.tensor
RUNTIMES = [
    OnnxRuntime,
    pytest.param(
        OpenVINORuntime,
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]

# index -> what it exercises; every negative index below is one PyTorch takes
INDICES = {
    "two": (T([-1, 0]), T([-1, -4])),
    "apart": (T([-3, 2]), slice(None), T([-5, 4])),
    "after_a_slice": (slice(None), T([-1, 0]), T([-5, -1])),
    "ellipsis": (T([-1]), ..., T([-5, 1])),
    "none": (T([-1, 0]), None, T([0, -1])),
    "broadcast": (T([[-1], [0]]), T([[-4, 3, -2]])),
    "three": (T([-3, 2]), T([-4, 0]), T([-5, 4])),
    "lists": ([-1, 0], [-1, -4]),
    "int32": (T([-1, 0], dtype=torch.int32), T([-1, -4], dtype=torch.int32)),
    "a_number_between": (T([-1, 0]), 2, T([-5, 4])),
    "mask_and_index": (T([True, False, True]), T([-1, 0])),
    "zero_d": (T(-1), T([-1, -2])),
}


@pytest.mark.parametrize("name", INDICES)
def test_exact_getitem_and_setitem_give_pytorchs_elements(name):
    index = INDICES[name]
    assert torch.equal(exact_getitem(X, index), X[index])
    expected, actual = X.clone(), X.clone()
    expected[index] = -7.0
    exact_setitem(actual, index, -7.0)
    assert torch.equal(actual, expected)


def test_an_index_pytorch_refuses_stays_refused():
    with pytest.raises(IndexError):
        exact_getitem(X, (T([-4, 0]), T([0, 0])))  # -4 + 3 is still negative
    with pytest.raises(IndexError):
        exact_getitem(X, (T([3, 0]), T([0, 0])))


def test_one_index_tensor_and_non_tensors_are_left_alone():
    index = T([-1, 0])
    assert exact_getitem(X, index) is not None and torch.equal(exact_getitem(X, index), X[index])
    assert exact_getitem((1, 2, 3), 1) == 2  # a tuple output picked by position


class _LastToken(torch.nn.Module):
    """``x[i, j]`` and last-token pooling, whose ``lengths - 1`` is -1 for an empty sequence."""

    def forward(self, x, i, j, lengths):
        return x[i, j], x[torch.arange(x.shape[0]), lengths - 1]


class TestLowering(expecttest.TestCase):
    def test_indices_that_can_be_negative_are_marked(self) -> None:
        x = torch.randn(4, 5)
        gm, _ = dynamo_frozen(_LastToken(), x, T([-1, 0]), T([-1, -5]), T([1, 2, 0, 5]))
        self.assertExpectedInline(
            format_graph(exact_lowering(gm), literals=True),
            """\
input l_x_
input l_i_
input l_j_
input l_lengths_
getitem = exact_getitem(l_x_, (l_i_, l_j_), nonnegative=())
sub = sub(l_lengths_, 1)
getitem_1 = exact_getitem(l_x_, ($embedl_folded_0, sub), nonnegative=(0))
return (getitem, getitem_1)""",
        )

    def test_one_index_or_proven_non_negative_indices_are_not_rewritten(self) -> None:
        def f(x, i):
            rows = torch.arange(x.shape[0])
            return x[i], x[rows, rows], x[rows[:, None], torch.arange(2)]

        gm, _ = dynamo_frozen(f, torch.randn(4, 5), T([-1, 0]))
        assert exact_lowering(gm) is gm


def _feed(gm, values):
    """``values`` (by input name) in the order of ``gm``'s placeholders (Dynamo's ``l_x_``)."""
    return [values[n.name[2:-1]] for n in gm.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exported_negative_indices_read_pytorchs_elements(runtime, tmp_path):
    """The first call is benign; the later ones read from the end, as PyTorch does (ONNX
    Runtime and OpenVINO gave [14, 15] for [19, 0] before)."""

    def f(x, i, j, lengths, cube, k):
        y = x.clone()
        y[i, j] = -1.0
        pooled = x[torch.arange(4), lengths - 1]
        return x[i, j], x[i[:, None], j[None, :]], pooled, y, cube[k, i, j]

    first = {
        "x": torch.arange(20.0).view(4, 5),
        "i": T([3, 0]),
        "j": T([4, 0]),
        "lengths": T([1, 2, 3, 4]),
        "cube": X,
        "k": T([0, 1]),
    }
    later = [
        {**first, "i": T([-1, 0]), "j": T([-1, -5])},  # the example: [19, 0]
        {**first, "lengths": T([3, 0, 5, 1])},  # an empty sequence reads its own last token
        {**first, "i": T([-4, -1]), "j": T([-5, 3]), "k": T([-3, -1])},
    ]
    gm, _ = dynamo_frozen(f, *first.values())
    built = runtime(Settings(cache_dir=tmp_path, num_threads=1)).build(gm, _feed(gm, first))
    for values in later:
        expected, actual = f(*values.values()), built(*_feed(gm, values))
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual):
            assert torch.equal(a, e), (values, a, e)
