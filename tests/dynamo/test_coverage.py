"""``embedl_dynamo.coverage``: where a model's ops would run, decided without building."""

from __future__ import annotations

import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.dynamo.coverage import GRAPH_BREAK
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime


class _WithCosh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cosh(torch.relu(self.conv(x)) * 0.1)
        return self.head(torch.sigmoid(y).mean((2, 3)) * 2.0)


def test_a_model_whose_every_op_conforms_is_fully_on_the_runtime():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)).eval()
    report = embedl_dynamo.coverage(model, (torch.randn(1, 3, 8, 8),), backend="openvino")
    assert report.fully_on_runtime and report.op_share == report.flop_share == 1.0
    assert report.kept == [] and report.graphs[0].runtimes == ("openvino",)


def test_the_op_kept_is_named_with_its_reason_and_the_flops_it_leaves(monkeypatch):
    builds = []
    monkeypatch.setattr(OnnxRuntime, "build", lambda self, *a, **k: builds.append(a))
    model = _WithCosh().eval()
    report = embedl_dynamo.coverage(model, (torch.randn(2, 3, 10, 10),), backend="onnxruntime")
    assert not report.fully_on_runtime
    (kept,) = report.kept
    assert (kept.op, kept.count) == ("cosh", 1) and "no conformance row" in kept.reason
    assert 0.8 < report.op_share < 1.0 and report.flop_share == 1.0  # convs and linears placed
    assert builds == [], "coverage builds nothing"


def test_coverage_leaves_the_model_and_dynamo_as_they_were():
    model = _WithCosh().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    embedl_dynamo.coverage(model, (torch.randn(1, 3, 10, 10),), backend="openvino")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    calls = []

    def counting(gm, inputs):
        calls.append(1)
        return gm.forward

    torch.compile(model, backend=counting)(torch.randn(1, 3, 10, 10))
    assert calls == [1]  # a fresh compile: coverage left no cached graph behind


class _RecurrentHead(nn.Module):
    """A convolution, then an LSTM: Dynamo skips a frame holding an RNN module unless
    ``torch._dynamo.config.allow_rnn`` is set, so none of it is in a graph."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3)
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.conv(x).transpose(1, 2))[0]


class _Branching(nn.Module):
    """Two linears with a data-dependent Python branch between them: a graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.first(x))
        if float(y.sum()) > 1e9:  # never true, but Dynamo cannot know
            y = y * 2
        return torch.relu(self.second(y)) * 2


def test_a_frame_dynamo_skips_is_no_coverage_but_a_kept_graph_break():
    report = embedl_dynamo.coverage(_RecurrentHead().eval(), (torch.randn(2, 4, 9),))
    assert report.graphs == [] and not report.fully_on_runtime
    (kept,) = report.kept
    assert kept.op == GRAPH_BREAK and "LSTM" in kept.reason and "allow_rnn" in kept.reason
    assert report.eager_flops > 0 and report.flop_share == 0.0


def test_a_graph_break_is_named_and_the_flops_between_graphs_are_counted():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU()).eval()
    whole = embedl_dynamo.coverage(model, (torch.randn(2, 8),))
    assert whole.fully_on_runtime and whole.eager_flops == sum(g.flops for g in whole.graphs)
    report = embedl_dynamo.coverage(_Branching().eval(), (torch.randn(2, 8),))
    assert not report.fully_on_runtime
    breaks = [k for k in report.kept if k.op == GRAPH_BREAK]
    assert len(breaks) == 1 and "item()" in breaks[0].reason
    assert report.eager_flops == sum(g.flops for g in report.graphs) > 0
