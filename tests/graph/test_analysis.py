"""One analysis record per graph state (issue 50; issue 52 item 2).

:func:`~embedl_dynamo.graph.analysis.analyze` computes a graph's aliasing and in-place facts
once, and every decision before any rewrite reads that record: an unchanged graph is never
analysed twice, however many decisions ask. The record's fields are checked on small Dynamo
graphs; nodes are found by what they are, never by their FX names.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import fx

import embedl_dynamo
from embedl_dynamo.graph import analysis as analysis_module
from embedl_dynamo.graph.analysis import LATEST_ANALYSIS, analysis_of, analyze, graph_state
from embedl_dynamo.graph.freeze import freeze, inference_blocker
from embedl_dynamo.graph.functionalize import functionalize
from embedl_dynamo.graph.output_views import output_views, with_view_bases
from tests.graph.test_inplace_idioms import Idiom as _Body
from tests.helpers import dynamo_graph


def _y(x):
    return x * 2 + 0.5


def _view_write_then_read(s, x):
    y = _y(x)
    y[0].fill_(1.0)
    return y + s.b


def _everything(s, x):
    x[:, :2].zero_()  # an input written through a view
    s.b.add_(1)  # a buffer written straight
    y = _y(x)
    y[..., :4].zero_()  # an intermediate written through a view
    return y + s.b, x.t()  # an output that is a view of an input


# graphs with in-place and view idioms the front of the pipeline decides on
IDIOMS = {
    "input add_": lambda s, x: (x.add_(1), _y(x) * 2)[1],
    "input writes returned": lambda s, x: x.mul_(2).add_(1),
    "buffer add_": lambda s, x: (s.b.add_(1), _y(x) + s.b)[1],
    "slice zero_": lambda s, x: (lambda y: (y[..., :4].zero_(), y)[1])(_y(x)),
    "view write then read": _view_write_then_read,
    "input slice zero_": lambda s, x: (x[:, :2].zero_(), x * 2)[1],
    "output view of input": lambda s, x: (x.t(), _y(x) * 2),
    "output and its view": lambda s, x: (lambda y: (y, y[0]))(_y(x)),
    "outputs two views, base not returned": lambda s, x: (lambda y: (y[0], y[1]))(_y(x)),
    "input through as_strided": lambda s, x: (x.as_strided((2, 2), (1, 6)).zero_(), x + 1)[1],
    "all of them": _everything,
}


def _graph(name: str) -> tuple[fx.GraphModule, list]:
    """Dynamo's graph of idiom ``name`` and its inputs, as a backend receives them."""
    captured = []

    def backend(gm, inputs, **_):
        captured.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_Body(IDIOMS[name]).eval(), backend=backend)(torch.randn(4, 6))
    (found,) = captured
    return found


def _same_state(a, b) -> bool:
    return len(a) == len(b) and all(x is y for r, o in zip(a, b) for x, y in zip(r, o))


@pytest.fixture
def analyses(monkeypatch):
    """Every analysis run, as ``(graph, state)``; fails on one of a state analysed before."""
    runs: list[tuple[fx.Graph, tuple]] = []
    alias_classes = analysis_module.alias_classes

    def counted(gm):
        state = graph_state(gm)
        again = [g for g, s in runs if g is gm.graph and _same_state(s, state)]
        assert not again, "an unchanged graph was analysed twice"
        runs.append((gm.graph, state))
        return alias_classes(gm)

    monkeypatch.setattr(analysis_module, "alias_classes", counted)
    return runs


def test_aliasing_is_computed_only_through_the_record():
    """No module but the analysis calls the aliasing functions itself: every decision reads
    the record (so counting the analysis counts every aliasing computation)."""
    import embedl_dynamo.dynamo.compile  # noqa: F401 - the whole front of the pipeline
    import embedl_dynamo.rewrite.engine  # noqa: F401

    binders = sorted(
        name
        for name, module in sys.modules.items()
        if name.startswith("embedl_dynamo.")
        and any(hasattr(module, f) for f in ("alias_classes", "identity_root"))
    )
    assert binders == ["embedl_dynamo.graph.aliasing", "embedl_dynamo.graph.analysis"]


@pytest.mark.parametrize("name", sorted(IDIOMS))
def test_front_of_pipeline_analyses_each_graph_state_once(name, analyses):
    """The backend's first steps (the view bases, the blocker, freezing, making the graph
    functional) on Dynamo's graph: one analysis of it, one of its copy returning view bases
    where it has them, one of the frozen graph and one per rewrite of it."""
    dynamo_gm, inputs = _graph(name)
    gm = dynamo_gm
    analysis = analyze(gm)  # where the backend receives the graph
    bases = with_view_bases(gm, analysis)
    if bases is not None:  # as prepare_subgraph does
        gm, analysis = bases.gm, analyze(bases.gm)
    blocker = inference_blocker(gm, inputs, analysis)
    if blocker is None:
        freeze(gm, inputs, write_back=True, analysis=analysis)
    assert sum(g is dynamo_gm.graph for g, _ in analyses) == 1
    states = 1 + (bases is not None) + (blocker is None)
    assert len({id(g) for g, _ in analyses}) == states


@pytest.mark.parametrize("name", ["all of them", "view write then read", "input add_"])
def test_compile_analyses_each_graph_state_once(name, analyses):
    """A whole compile, the rewrite engine included, analyses no graph state twice, and
    gives eager's numbers."""
    torch.manual_seed(0)
    model, x = _Body(IDIOMS[name]).eval(), torch.randn(4, 6)
    want_model, want_x = _Body(IDIOMS[name]).eval(), x.clone()
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(model, backend="embedl_onnxruntime")(x)
        want = want_model(want_x)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.status == "compiled", sub.reason
    for g, w in zip(_flat(got), _flat(want), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    torch.testing.assert_close(x, want_x, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.b, want_model.b, rtol=0, atol=0)
    assert analyses, "the compile analysed nothing"


def _flat(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _placeholder(gm: fx.GraphModule) -> fx.Node:
    """The graph's input ``x`` (the only 2-d placeholder; the buffer is 1-d)."""
    values = {n: n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"}
    (node,) = [n for n, value in values.items() if getattr(value, "ndim", 0) == 2]
    return node


def test_written_input():
    gm = dynamo_graph(_Body(IDIOMS["input add_"]), torch.randn(4, 6))
    record = analyze(gm)
    x = _placeholder(gm)
    ((op, written),) = record.written_inputs.items()
    assert written is x and record.mutated[op] is x and record.roots[op] is x
    assert record.writes_into_input
    assert not record.returned_inputs
    assert x in record.inputs


def test_returned_input():
    gm = dynamo_graph(_Body(IDIOMS["input writes returned"]), torch.randn(4, 6))
    record = analyze(gm)
    x = _placeholder(gm)
    assert dict(record.returned_inputs) == {0: x}
    assert set(record.written_inputs.values()) == {x}
    assert len(record.written_inputs) == 2  # mul_ then add_, both written back into x
    assert record.roots[record.outputs[0]] is x


def test_output_view_of_an_input():
    gm = dynamo_graph(_Body(IDIOMS["output view of input"]), torch.randn(4, 6))
    record = analyze(gm)
    x = _placeholder(gm)
    view, product = record.outputs
    assert record.classes[view] == record.classes[x]
    assert record.classes[product] != record.classes[x]
    assert not record.mutated and not record.written_inputs and not record.writes_into_input
    assert not record.returned_inputs  # a view of x, not x itself
    (position,) = output_views(gm, record)
    regenerated = output_views(gm, record)[position]
    assert position == 0 and regenerated.of_input
    base = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(regenerated(base), base.t())


def test_members_group_the_nodes_sharing_storage():
    gm = dynamo_graph(_Body(IDIOMS["slice zero_"]), torch.randn(4, 6))
    record = analyze(gm)
    (write,) = record.mutated
    target = record.mutated[write]
    group = record.members[record.classes[target]]
    assert write in group and target in group
    assert [record.order[n] for n in group] == sorted(record.order[n] for n in group)
    assert not record.writes_into_input  # an intermediate, not an input


def test_a_record_of_an_earlier_state_is_refused():
    gm = dynamo_graph(_Body(IDIOMS["slice zero_"]), torch.randn(4, 6))
    record = analyze(gm)
    assert analysis_of(gm, record) is record
    functionalize(gm, analysis=record)
    assert not record.describes(gm)
    with pytest.raises(ValueError, match="another graph state"):
        analysis_of(gm, record)
    assert analyze(gm).describes(gm)


def test_the_count_sees_a_second_analysis_of_one_state(analyses):
    """The check above has teeth: analysing a graph state again is caught (here with the
    graph's latest record dropped, which ``analyze`` reads again while the graph is unchanged)."""
    gm = dynamo_graph(_Body(IDIOMS["input add_"]), torch.randn(4, 6))
    assert analyze(gm) is analyze(gm)  # unchanged: the same record, not a second analysis
    delattr(gm.graph, LATEST_ANALYSIS)
    with pytest.raises(AssertionError, match="analysed twice"):
        analyze(gm)
