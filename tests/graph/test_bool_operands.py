"""Binary ops with a Python ``bool`` operand (:mod:`embedl_dynamo.graph.bool_operands`): the
TorchScript exporter takes none of them, which sent the whole graph to PyTorch; their exact
forms compute PyTorch's values and dtypes, and export to ONNX Runtime and OpenVINO."""

from __future__ import annotations

import operator

import expecttest
import pytest
import torch

from embedl_dynamo.graph.bool_operands import bool_operand_form, exact_bool_operand
from embedl_dynamo.graph.exact_ops import exact_lowering
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from tests.helpers import dynamo_frozen

RUNTIMES = [
    OnnxRuntime,
    pytest.param(
        OpenVINORuntime,
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]
X = torch.tensor([[-1.5, 0.0, 2.0], [3.0, -0.0, 1.0]])
M = torch.tensor([[True, False, True], [False, False, True]])
I = torch.tensor([[-2, 0, 1], [5, 1, 0]], dtype=torch.int32)  # noqa: E741

# (call, kind) -> operands, for every form the module writes
FORMS = [
    ("operator.le", "le", (M, True)),
    ("operator.lt", "lt", (I, False)),
    ("operator.eq", "eq", (X, True)),
    ("operator.ne", "ne", (True, M)),
    ("operator.and_", "and_", (M, True)),
    ("operator.or_", "or_", (False, M)),
    ("operator.xor", "xor", (M, True)),
    ("torch.bitwise_and", "bitwise_and", (M, False)),
    ("torch.mul", "mul", (X, True)),
    ("torch.mul", "mul", (M, True)),
    ("operator.add", "add", (M, False)),
    ("torch.add", "add", (I, True)),
    ("operator.truediv", "truediv", (I, True)),
    ("method.__rtruediv__", "truediv", (X, True)),
    ("method.__rxor__", "xor", (M, False)),
    ("method.eq", "eq", (M, False)),
]


@pytest.mark.parametrize(("call", "kind", "operands"), FORMS, ids=lambda v: str(v)[:20])
def test_the_form_gives_pytorchs_values_and_dtype(call, kind, operands):
    a, b = operands
    if call.startswith("method."):
        expected = getattr(a, call.removeprefix("method."))(b)
    else:
        module, _, name = call.partition(".")
        expected = getattr(operator if module == "operator" else torch, name)(a, b)
    actual = exact_bool_operand(a, b, call=call, kind=kind)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


class _BoolOperands(torch.nn.Module):
    def forward(self, x, m):
        return (m <= True) & (m ^ True), (x > 0) == True, x * True, m | False  # noqa: E712


class _NoForm(torch.nn.Module):
    """Ops the module leaves alone, each with its reason."""

    def forward(self, x, m, i):
        return (
            i & True,  # an integer bitwise op: the exporter takes none, with any operand
            x * 2,  # no bool operand
            m == m,  # no Python bool
            torch.add(x, True, alpha=2),  # alpha other than 1
            torch.sub(x, 1),  # PyTorch refuses to subtract a bool: no form to write
        )


class TestLowering(expecttest.TestCase):
    def test_bool_operands_are_marked(self) -> None:
        gm, _ = dynamo_frozen(_BoolOperands(), X, M)
        self.assertExpectedInline(
            format_graph(exact_lowering(gm), literals=True),
            """\
input l_m_
input l_x_
le = exact_bool_operand(l_m_, True, call='operator.le', kind='le')
xor = exact_bool_operand(l_m_, True, call='operator.xor', kind='xor')
and_ = and_(le, xor)
gt = gt(l_x_, 0)
eq = exact_bool_operand(gt, True, call='operator.eq', kind='eq')
mul = exact_bool_operand(l_x_, True, call='operator.mul', kind='mul')
or_ = exact_bool_operand(l_m_, False, call='operator.or_', kind='or_')
return (and_, eq, mul, or_)""",
        )

    def test_ops_without_an_exportable_form_are_left_alone(self) -> None:
        gm, _ = dynamo_frozen(_NoForm(), X, M, I)
        assert all(bool_operand_form(node) is None for node in gm.graph.nodes)
        assert exact_lowering(gm) is gm


def _feed(gm, x, m):
    """``x`` and ``m`` in the order of ``gm``'s placeholders (Dynamo's ``l_x_``, ``l_m_``)."""
    values = {"l_x_": x, "l_m_": m}
    return [values[n.name] for n in gm.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exported_bool_operands_give_pytorchs_outputs(runtime, tmp_path):
    """The graph exports (before, the exporter stopped at ``aten::le(Tensor, bool)``) and
    computes PyTorch's values on a later call."""
    gm, _ = dynamo_frozen(_BoolOperands(), X, M)
    built = runtime(Settings(cache_dir=tmp_path, num_threads=1)).build(gm, _feed(gm, X, M))
    x, m = torch.randn(2, 3), torch.rand(2, 3) > 0.5
    for expected, actual in zip(_BoolOperands()(x, m), built(*_feed(gm, x, m)), strict=True):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
