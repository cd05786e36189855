"""``batch_norm`` over its input's own statistics (:mod:`embedl_dynamo.graph.batch_statistics`):
timm's weight standardisation (``StdConv2d``: BiT, NFNet) and a statistics-only normalisation
of activations are written at freezing as the ops they compute, so the model is frozen for
inference and runs whole on each CPU runtime within the float bound of eager; a ``batch_norm``
with running statistics in training mode still trains and is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.graph.batch_statistics import decompose_batch_statistics, uses_batch_statistics
from embedl_dynamo.graph.freeze import inference_blocker
from embedl_dynamo.runtimes.conformance import node_blocker, op_name
from tests.helpers import dynamo_frozen, dynamo_graph, runtime_compiled


class _StdConv2d(nn.Conv2d):
    """timm's ``StdConv2d``: the weight standardised per output channel on every call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.weight.reshape(1, self.out_channels, -1)
        weight = F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-6)
        return F.conv2d(x, weight.reshape_as(self.weight), self.bias, padding=self.padding)


class _StdNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = _StdConv2d(3, 8, 3, padding=1), _StdConv2d(8, 4, 3)
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        y = F.batch_norm(y, None, None, self.scale, None, True, 0.1, 1e-5)  # on activations
        return self.conv2(y).mean((2, 3))


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [
        getattr(n.target, "__name__", str(n.target))
        for n in gm.graph.nodes
        if n.op != "placeholder" and n.op != "output" and n.op != "get_attr"
    ]


def test_batch_statistics_are_written_as_the_ops_they_compute():
    model, x = _StdNet().eval(), torch.randn(2, 3, 10, 10)
    gm, inputs = dynamo_frozen(model, x)
    ops = _ops(gm)
    assert "batch_norm" not in ops
    # per batch_norm: mean, sub, mul, mean, add, rsqrt, mul (and the scale: reshape, mul)
    assert ops.count("rsqrt") == 3 and ops.count("mean") == 3 * 2 + 1
    torch.testing.assert_close(gm(*inputs)[0], model(x), rtol=1e-4, atol=1e-5)


def test_running_statistics_in_training_mode_still_train_and_are_refused():
    bn = nn.BatchNorm2d(3).train()  # updates its running mean and variance
    gm = dynamo_graph(bn, torch.randn(2, 3, 4, 4))
    assert not any(uses_batch_statistics(n) for n in gm.graph.nodes)
    assert "runs in training mode" in inference_blocker(gm, [])  # read before any input
    eval_graph, _ = dynamo_frozen(nn.BatchNorm2d(3).eval(), torch.randn(2, 3, 4, 4))
    assert "batch_norm" in _ops(eval_graph)  # the eval form keeps its own row


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_weight_standardised_net_runs_whole_on_the_runtime(runtime):
    model = _StdNet().eval()
    compiled = runtime_compiled(model, runtime)
    with torch.no_grad():
        for seed in range(2):
            x = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    assert (sub.status, sub.runtime, sub.kept) == ("compiled", runtime, [])


def test_one_left_as_batch_norm_is_judged_apart_and_kept():
    """Without a recorded float32 shape (here: none at all) the node is not written as its
    ops, and the table does not judge it by the eval form's row: no runtime takes it."""
    gm = torch.fx.symbolic_trace(lambda x: F.batch_norm(x, None, None, training=True))
    assert decompose_batch_statistics(gm) == 0
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert op_name(node) == "batch_norm(batch statistics)"
    for runtime in ("onnxruntime", "openvino"):
        assert "batch_norm(batch statistics)" in node_blocker(node, runtime)
