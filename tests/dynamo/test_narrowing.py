"""A runtime that fails on part of a graph keeps only the ops that fail in PyTorch
(:mod:`embedl_dynamo.dynamo.narrowing`): the rest of the graph still runs on the runtime,
whether the runtime took the graph whole or one fragment of it."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.dynamo import partitioned
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from tests.helpers import assert_close_to_scale

REAL_BUILD = OnnxRuntime.build


def _fails_on_sigmoid(self, gm, inputs, judge=None):
    """ONNX Runtime's build, failing as an exporter does on an op form it cannot write."""
    if any(
        n.op.startswith("call") and n.target in (torch.sigmoid, "sigmoid") for n in gm.graph.nodes
    ):
        raise RuntimeError("export failed: no ONNX form for this sigmoid")
    return REAL_BUILD(self, gm, inputs, judge)


class _Net(nn.Module):
    """Conv, ReLU, a scaled tanh, a sigmoid gate, conv, ReLU, pooling, linear; ``cosh`` (no
    conformance row) with ``with_cosh``."""

    def __init__(self, with_cosh: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.head = nn.Linear(8, 4)
        self.with_cosh = with_cosh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(torch.relu(self.conv1(x)) * 0.5)
        if self.with_cosh:
            y = torch.cosh(y * 0.1)
        y = y * torch.sigmoid(y)
        y = torch.relu(self.conv2(y))
        return self.head(y.mean((2, 3)))


def _run(model: nn.Module, x: torch.Tensor, **options):
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)
        return compiled(x)


def test_a_whole_graph_the_runtime_fails_on_keeps_only_the_failing_op(monkeypatch):
    monkeypatch.setattr(OnnxRuntime, "build", _fails_on_sigmoid)
    model, x = _Net().eval(), torch.randn(2, 3, 12, 12)
    assert_close_to_scale(_run(model, x, beat_eager=False), model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("partitioned", "onnxruntime"), sub.reason
    assert [k["op"] for k in sub.kept] == ["sigmoid"]
    assert "onnxruntime failed on it: RuntimeError: export failed" in sub.kept[0]["reason"]
    assert [(p.runtime, p.status) for p in sub.partitions] == [("onnxruntime", "compiled")] * 2
    assert sub.coverage["ops_on_runtime"] == sub.coverage["ops"] - 1


def test_a_fragment_the_runtime_fails_on_keeps_only_the_failing_op(monkeypatch):
    monkeypatch.setattr(OnnxRuntime, "build", _fails_on_sigmoid)
    model, x = _Net(with_cosh=True).eval(), torch.randn(2, 3, 12, 12)
    assert_close_to_scale(_run(model, x, beat_eager=False), model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sorted(k["op"] for k in sub.kept) == ["cosh", "sigmoid"], sub.kept
    assert all(p.runtime == "onnxruntime" for p in sub.partitions), sub.partitions


def test_a_failure_no_part_reproduces_leaves_the_graph_in_pytorch(monkeypatch):
    """The whole fails, every part alone builds: nothing narrower is known, so the graph runs
    in PyTorch as before, after two probes (its halves)."""
    parts = []

    def fails_on_the_whole(self, gm, inputs, judge=None):
        convolutions = [
            n for n in gm.graph.nodes if n.op.startswith("call") and "conv" in str(n.target)
        ]
        if len(convolutions) > 1:
            raise RuntimeError("the whole graph fails")
        parts.append(len(convolutions))
        return REAL_BUILD(self, gm, inputs, judge)

    monkeypatch.setattr(OnnxRuntime, "build", fails_on_the_whole)
    model, x = _Net().eval(), torch.randn(2, 3, 12, 12)
    assert_close_to_scale(_run(model, x, beat_eager=False), model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("eager", "eager"), (sub.kept, parts)
    assert "the whole graph fails" in sub.reason
    assert len(parts) == 2, parts


def test_an_op_one_runtime_fails_on_runs_on_another(monkeypatch):
    """The ops a runtime fails on are held from that runtime only: the next runtime of the
    partition (OpenVINO after ONNX Runtime) takes them, and nothing stays in PyTorch."""
    monkeypatch.setattr(OnnxRuntime, "build", _fails_on_sigmoid)
    model, x = _Net().eval(), torch.randn(2, 3, 12, 12)
    out = _run(model, x, beat_eager=False, min_subgraph_size=1)
    assert_close_to_scale(out, model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert not sub.kept, sub.kept
    assert [p.runtime for p in sub.partitions] == ["onnxruntime", "openvino", "onnxruntime"]


def test_held_ops_stay_in_pytorch_where_another_runtime_cannot_be_stitched_in(monkeypatch):
    """Where the fragments another runtime would take cannot be ordered with the rest (in-place
    writes ordering two fragments both ways), the failing ops are held from every runtime."""
    monkeypatch.setattr(OnnxRuntime, "build", _fails_on_sigmoid)
    monkeypatch.setattr(partitioned, "can_stitch", lambda graph, fragments: False)
    model, x = _Net().eval(), torch.randn(2, 3, 12, 12)
    out = _run(model, x, beat_eager=False, min_subgraph_size=1)
    assert_close_to_scale(out, model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert [k["op"] for k in sub.kept] == ["sigmoid"]
    assert {p.runtime for p in sub.partitions} == {"onnxruntime"}
