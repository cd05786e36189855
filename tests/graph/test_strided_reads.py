"""``as_strided`` over a storage laid out otherwise than its input's logical order becomes a
gather of the input's elements (:mod:`embedl_dynamo.graph.strided_reads`)."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from embedl_dynamo.graph.strided_reads import (
    gather_strided_reads,
    strided_index,
    strided_read_blocker,
)


def _traced(function, x: torch.Tensor) -> fx.GraphModule:
    gm = fx.symbolic_trace(function)
    ShapeProp(gm).propagate(x)  # records each value's strides, as Dynamo's fake tensors do
    for node in gm.graph.nodes:
        if "tensor_meta" in node.meta:
            node.meta["val"] = torch.empty_strided(
                node.meta["tensor_meta"].shape, node.meta["tensor_meta"].stride
            )
    return gm


def _printout(gm: fx.GraphModule) -> str:
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    return "\n".join(getattr(n.target, "__name__", str(n.target)) for n in nodes)


def _transposed(x):
    return (x * 2).t().as_strided((3, 2), (1, 3)) + 1


def _contiguous(x):
    return (x * 2).as_strided((2, 3), (3, 1)) + 1


def _past(x):
    return (x * 2)[:1].as_strided((2, 3), (3, 1)) + 1


def test_a_transposed_input_is_gathered_by_its_elements_logical_index():
    x = torch.randn(2, 3)
    gm = _traced(_transposed, x)
    assert gather_strided_reads(gm) == 1
    assert_expected_inline(
        _printout(gm),
        """\
mul
t
reshape
getitem
add""",
    )
    assert torch.equal(gm(x), _transposed(x))
    y = torch.randn(2, 3)
    assert torch.equal(gm(y), _transposed(y))  # the index holds for every value


@pytest.mark.parametrize(
    ("function", "why"),
    [
        (_contiguous, "a contiguous input from its storage's start is the table's row"),
        (_past, "a read past the input's elements is a blocker, not a gather"),
    ],
)
def test_no_gather_where_the_storage_is_the_inputs_own_or_holds_more(function, why):
    gm = _traced(function, torch.randn(2, 3))
    if function is _past:
        assert "outside its input's elements" in strided_read_blocker(gm), why
        with pytest.raises(ValueError, match="outside its input's elements"):
            gather_strided_reads(gm)
    else:
        assert strided_read_blocker(gm) is None and gather_strided_reads(gm) == 0, why


def test_the_index_reads_what_eagers_storage_holds_for_overlapping_and_expanded_inputs():
    base = torch.randn(4, 1).expand(4, 3)  # several elements share one storage position
    for value, size, stride, offset in [
        (torch.randn(3, 8).t(), (7, 3), (3, 1), 1),
        (base, (2, 2), (1, 1), 1),
        (torch.randn(2, 4, 8, 16).transpose(0, 1), (2, 7, 8, 16), (16, 128, 32, 1), 0),
    ]:
        index = strided_index(value, size, stride, offset)
        assert torch.equal(value.reshape(-1)[index], value.as_strided(size, stride, offset))
