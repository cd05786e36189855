"""``as_strided`` reads storage, not values. Over an input contiguous from the start of its
storage, reading its own elements (Longformer's overlapping chunks), it is the table's row; over
another layout freezing writes it as a gather of the elements eager's storage gives
(:mod:`embedl_dynamo.graph.strided_reads`); a read past the input's own elements keeps the graph
in PyTorch. Each answers as eager does, where a runtime's contiguous copy would not."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from tests.helpers import runtime_compiled


def _overlapping_chunks(x: torch.Tensor) -> torch.Tensor:
    """Longformer's ``_chunk``: windows of 4 rows overlapping by 2, as strided views."""
    y = torch.relu(x * 2)  # contiguous, its own storage
    return y.as_strided((3, 4, 6), (12, 6, 1)) * 3


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """A view whose storage order is not its logical order: eager reads the storage."""
    y = torch.relu(x * 2).t()
    return y.as_strided((3, 4), (4, 1)) * 3


def _past_its_elements(x: torch.Tensor) -> torch.Tensor:
    """A slice that is contiguous from its storage's start, strided past its own elements."""
    y = torch.relu(x * 2)[:2]
    return y.as_strided((3, 6), (6, 1)) * 3


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize(
    ("function", "shape"),
    [(_overlapping_chunks, (8, 6)), (_transposed, (4, 3))],
    ids=["a contiguous input's own elements: the row", "a transposed view: a gather"],
)
def test_strided_reads_run_on_the_runtime_as_in_eager(function, shape, runtime):
    compiled = runtime_compiled(function, runtime)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(*shape)
            assert torch.equal(compiled(x), function(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == runtime and not sub.kept


def test_strides_past_the_inputs_elements_keep_the_graph_in_pytorch():
    compiled = runtime_compiled(_past_its_elements, "onnxruntime")
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="outside its input's elements"):
        for _ in range(2):
            x = torch.randn(4, 6)
            assert torch.equal(compiled(x), _past_its_elements(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "eager" and "outside its input's elements" in sub.reason
