"""Index edge inputs through ``torch.compile`` (issue 50, 2.1 and 2.2): a benign first call, then
later calls with negative, empty-sequence and out-of-range indices. An index PyTorch takes gives
PyTorch's element (:mod:`embedl_dynamo.graph.exact_index`); one PyTorch refuses raises PyTorch's
error, not a value a runtime made up (:mod:`embedl_dynamo.graph.index_guards`). An index op on a
0-d tensor, or a scatter with ``reduce``, has no ONNX form: it stays in PyTorch, with its row's
reason."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import Verdict, rule_for
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import compile_on

T = torch.tensor
RUNTIMES = [
    "onnxruntime",
    pytest.param(
        "openvino",
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]
X = torch.arange(20.0).view(4, 5)
CUBE = torch.arange(60.0).view(3, 4, 5)
TABLE = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))


# the issue's own examples run in the README's test command; the rest under ``slow``
CORE = (
    "two_negative",
    "last_token_of_an_empty_sequence",
    "embedding_minus_one",
    "embedding_past_the_table",
)


def _cases(table):
    slow = pytest.mark.slow
    return [pytest.param(name, marks=() if name in CORE else slow) for name in table]


def _compiled(fn, runtime):
    backend = "embedl_openvino" if runtime == "openvino" else "embedl_onnxruntime"
    return torch.compile(fn, backend=backend, options={"min_subgraph_size": 1}, dynamic=False)


def _rows(x, i, j):
    return x[i, j] * 1


def _last_token(h, lengths):
    return h[torch.arange(h.shape[0]), lengths - 1] * 1


def _written(x, i, j):
    y = x * 1
    y[i, j] = -1.0
    return y


# name -> (function, benign first inputs, later inputs PyTorch takes)
VALID = {
    "two_negative": (_rows, (X, T([3, 0]), T([4, 0])), (X, T([-1, 0]), T([-1, -5]))),
    "broadcast": (
        lambda x, i, j: x[i[:, None], j[None, :]] * 1,
        (X, T([3, 0]), T([4, 0, 1])),
        (X, T([-4, -1]), T([-5, 2, -1])),
    ),
    "three": (
        lambda c, k, i, j: c[k, i, j] * 1,
        (CUBE, T([0, 2]), T([3, 0]), T([4, 0])),
        (CUBE, T([-3, -1]), T([-1, 0]), T([-5, -1])),
    ),
    "last_token_of_an_empty_sequence": (_last_token, (X, T([1, 2, 3, 4])), (X, T([5, 0, 2, 1]))),
    "written_at_negative_positions": (
        _written,
        (X, T([3, 0]), T([4, 0])),
        (X, T([-1, 0]), T([-1, -5])),
    ),
    "one_index_from_the_end": (lambda x, i: x[i] * 1, (X, T([0, 3])), (X, T([-4, -1]))),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", _cases(VALID))
def test_a_valid_negative_index_reads_pytorchs_element(case, runtime):
    fn, first, later = VALID[case]
    compiled = _compiled(fn, runtime)
    assert torch.equal(compiled(*first), fn(*first))
    (subgraph,) = last_report().subgraphs
    # OpenVINO leaves int64 arithmetic (lengths - 1) to ONNX Runtime: nothing in PyTorch
    assert runtime in subgraph.runtime.split("+") and not subgraph.kept, subgraph.reason
    assert torch.equal(compiled(*later), fn(*later)), case


# name -> (function, benign first inputs, later inputs PyTorch refuses)
REFUSED = {
    "embedding_minus_one": (F.embedding, (T([0, 5]), TABLE), (T([-1, 0]), TABLE)),
    "embedding_past_the_table": (F.embedding, (T([0, 5]), TABLE), (T([6, 0]), TABLE)),
    "gather_minus_one": (
        lambda x, g: torch.gather(x * 1, 1, g),
        (X, T([[0, 4]] * 4)),
        (X, T([[-1, 0]] * 4)),
    ),
    "index_select_minus_one": (lambda x, s: (x * 1).index_select(0, s), (X, T([3])), (X, T([-1]))),
    "index_copy_minus_one": (
        lambda x, s: (x * 1).index_copy(0, s, torch.ones(1, 5)),
        (X, T([3])),
        (X, T([-1])),
    ),
    "scatter_minus_one": (
        lambda x, s: (x * 1).scatter(1, s, 1.0),
        (X, T([[4]] * 4)),
        (X, T([[-1]] * 4)),
    ),
    "getitem_past_the_end": (lambda x, i: x[i] * 1, (X, T([0, 3])), (X, T([4, 0]))),
    "getitem_before_the_start": (_rows, (X, T([3, 0]), T([4, 0])), (X, T([-5, 0]), T([0, 0]))),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", _cases(REFUSED))
def test_an_index_pytorch_refuses_raises_pytorchs_error(case, runtime):
    fn, first, later = REFUSED[case]
    compiled = _compiled(fn, runtime)
    with torch.no_grad():
        assert torch.equal(compiled(*first), fn(*first))
        with pytest.raises((IndexError, RuntimeError)) as eager:
            fn(*later)
        with pytest.raises(eager.type):
            compiled(*later)


_S = T(2.0)
# name -> (function, inputs): index ops in forms the export has no ONNX form of, each its own
# row of the conformance table, kept in PyTorch while the graph's ``clone`` runs on the runtime.
# Before, a 0-d input failed inside the compile (IndexError: the index guard read the size of
# dim 0 of a 0-d tensor) in every dtype, and a reduce failed the export
OTHER_FORMS = {
    "gather(0-d)": (lambda x, i: torch.gather(x, 0, i).clone(), (_S, T([0, 0]))),
    "scatter(0-d)": (lambda x, i: torch.scatter(x, 0, i, x).clone(), (_S, T(0))),
    "scatter_add(0-d)": (lambda x, i: torch.scatter_add(x, 0, i, x).clone(), (_S, T(0))),
    "index_add(0-d)": (lambda x, i: torch.index_add(x, 0, i, x).clone(), (_S, T([0]))),
    "index_copy(0-d)": (lambda x, i: torch.index_copy(x, 0, i, x).clone(), (_S, T([0]))),
    "scatter(reduce='add')": (
        lambda x, i: torch.scatter(x, 1, i, x, reduce="add").clone(),
        (X, T([[0, 1, 1]] * 4)),
    ),
    "scatter(reduce='multiply')": (
        lambda x, i: torch.scatter(x, 1, i, x, reduce="multiply").clone(),
        (X, T([[0, 1, 1]] * 4)),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("form", OTHER_FORMS)
def test_an_index_form_without_an_onnx_form_stays_in_pytorch_with_its_reason(form, runtime, dtype):
    fn, (x, index) = OTHER_FORMS[form]
    x = (x > 1) if dtype == torch.bool else x.to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scatter's reduce is deprecated
        expected = fn(x, index)
        torch._dynamo.reset()
        actual = compile_on(fn, runtime, fallback="raise")(x, index)  # no build fails
    assert torch.equal(actual, expected)
    (subgraph,) = last_report().subgraphs
    rule = rule_for(form, runtime, dtype)
    assert rule.verdict is Verdict.KEPT
    kept = [(k["op"], k["reason"]) for k in subgraph.kept]
    reason = f"{form} on {dtype} stays in PyTorch on {runtime}: {rule.reason}"
    assert kept == [(form.split("(")[0], reason)]  # the op, named by its form in the reason
    assert subgraph.status == "partitioned" and runtime in subgraph.runtime, subgraph.reason
