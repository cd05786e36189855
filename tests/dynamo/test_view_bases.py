"""Outputs that view one tensor the graph does not return (CvT's ``torch.split`` of its
hidden state into the class token and the rest): the tensor becomes a hidden extra output,
the views are regenerated from it, and the graph runs on the runtime
(:func:`embedl_dynamo.graph.output_views.with_view_bases`)."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo.graph.output_views import with_view_bases
from tests.helpers import runtime_compiled


def _split_outputs(x):
    first, rest = torch.split(x * 2, [1, 3])
    return first, rest.t()


def _printout(gm: fx.GraphModule) -> str:
    """The graph's ops and what it returns, by op and position, without FX node names."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    index = {n: f"%{i}" for i, n in enumerate(nodes)}
    index.update({n: "x" for n in gm.graph.nodes if n.op == "placeholder"})
    lines = [f"{index[n]} = {getattr(n.target, '__name__', n.target)}" for n in nodes]
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return "\n".join([*lines, f"return {', '.join(index[v] for v in output)}"])


def test_two_views_of_an_intermediate_return_it_after_the_outputs():
    bases = with_view_bases(fx.symbolic_trace(_split_outputs))
    assert bases is not None and bases.outputs == 2
    assert_expected_inline(
        _printout(bases.gm),
        """\
%0 = mul
%1 = split
%2 = getitem
%3 = getitem
%4 = t
return %2, %4, %0""",
    )
    outputs = bases.gm(torch.arange(4.0))
    assert [o.tolist() for o in bases.visible(outputs)] == [[0.0], [2.0, 4.0, 6.0]]


@pytest.mark.parametrize(
    ("why", "function"),
    [
        ("one view alone aliases nothing", lambda x: ((x * 2)[0], x + 1)),
        (
            "the tensor is returned, so the views are regenerated from it",
            lambda x: (x * 2, (x * 2)[0]),
        ),
        ("views of an input are regenerated from the caller's input", lambda x: (x[0], x[1])),
        ("a single output is no container to extend", lambda x: (x * 2)[0]),
    ],
)
def test_no_hidden_output_where_no_outputs_share_an_unreturned_tensor(why, function):
    assert with_view_bases(fx.symbolic_trace(function)) is None, why


class _ClassToken(nn.Module):
    """CvT's last stage: the hidden state split into its class token and the patches."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.linear(x).relu()
        cls_token, patches = torch.split(hidden, [1, 3], 1)
        return {"cls_token": cls_token, "patches": patches.transpose(1, 2)}


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_views_of_one_tensor_run_on_the_runtime_and_share_its_memory(runtime):
    model, x = _ClassToken().eval(), torch.randn(2, 4, 8)
    compiled = runtime_compiled(model, runtime)
    with torch.no_grad():
        expected = model(x)
        for _ in range(2):
            actual = compiled(x)
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == [runtime]
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-5)
        assert actual[name].stride() == expected[name].stride()
    # one storage, as in eager's outputs, so a write into one shows through the other
    storages = {actual[name].untyped_storage().data_ptr() for name in actual}
    assert len(storages) == 1


def test_views_of_a_tensor_written_after_they_were_taken_see_the_write():
    def written_after(x):
        hidden = x * 2
        first, rest = hidden[0], hidden[1:]
        hidden.add_(1)
        return first, rest

    compiled = runtime_compiled(written_after, "onnxruntime")
    x = torch.randn(3, 4)
    with torch.no_grad():
        actual = compiled(x)
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == ["onnxruntime"]
    torch.testing.assert_close(actual, written_after(x), rtol=0, atol=0)
