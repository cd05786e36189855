"""Partitioning by capability (:mod:`embedl_dynamo.partition`): which nodes of a frozen graph
go to which runtime, the fragments as graphs of their own, and the graph stitched back."""

from __future__ import annotations

import expecttest
import torch
from torch import fx, nn

from embedl_dynamo.partition import fragment_inputs, partition_graph, stitch
from embedl_dynamo.partition.fragments import indexing
from tests.helpers import dynamo_frozen


class _CoshInTheMiddle(nn.Module):
    """A conv net with ``cosh`` (no conformance row) between two runtime regions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)) * 2.0
        y = torch.cosh(y)
        return self.head(torch.sigmoid(y).mean((2, 3)) + 1.0)


def _describe(partitioning) -> str:
    """The partition as text: each fragment's runtime and ops, then each kept op and why."""
    lines = []
    for k, fragment in enumerate(partitioning.fragments):
        ops = ", ".join(str(getattr(n.target, "__name__", n.target)) for n in fragment.nodes)
        lines.append(f"fragment {k} on {fragment.runtime}: {ops}")
    for kept in partitioning.kept:
        lines.append(f"kept {kept.op}{' (small)' if kept.small else ''}: {kept.reason}")
    return "\n".join(lines)


class TestPartition(expecttest.TestCase):
    def test_the_op_without_a_row_stays_and_both_sides_run_on_the_runtime(self) -> None:
        gm, inputs = dynamo_frozen(_CoshInTheMiddle().eval(), torch.randn(2, 3, 8, 8))
        partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
        self.assertExpectedInline(
            _describe(partitioning),
            """\
fragment 0 on onnxruntime: conv2d, relu, mul
fragment 1 on onnxruntime: sigmoid, mean, add, linear
kept cosh: cosh on torch.float32 has no conformance row for onnxruntime; runs in PyTorch""",
        )
        assert partitioning.ops == 8 and partitioning.ops_on_runtimes == 7
        assert not partitioning.whole

    def test_a_fragment_below_the_minimum_size_stays_with_that_reason(self) -> None:
        gm, _ = dynamo_frozen(_CoshInTheMiddle().eval(), torch.randn(2, 3, 8, 8))
        partitioning = partition_graph(gm, ["onnxruntime"], min_ops=4)
        self.assertExpectedInline(
            _describe(partitioning),
            """\
fragment 0 on onnxruntime: sigmoid, mean, add, linear
kept conv2d (small): a fragment of 3 ops < min_subgraph_size=4
kept relu (small): a fragment of 3 ops < min_subgraph_size=4
kept mul (small): a fragment of 3 ops < min_subgraph_size=4
kept cosh: cosh on torch.float32 has no conformance row for onnxruntime; runs in PyTorch""",
        )
        assert partitioning.blocker.op == "cosh"

    def test_a_graph_every_node_of_which_conforms_is_one_fragment(self) -> None:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten()).eval()
        gm, _ = dynamo_frozen(model, torch.randn(1, 3, 8, 8))
        partitioning = partition_graph(gm, ["onnxruntime", "openvino"], min_ops=1)
        assert partitioning.whole and partitioning.fragments[0].runtime == "onnxruntime"


def test_stitched_fragments_compute_the_graph_and_read_their_inputs():
    gm, inputs = dynamo_frozen(_CoshInTheMiddle().eval(), torch.randn(2, 3, 8, 8))
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    fragments = partitioning.fragments
    (received,) = zip(*fragment_inputs(gm, fragments, [inputs]))
    assert [len(r) for r in received] == [1, 1]  # x; then cosh's output
    assert torch.equal(received[0][0], inputs[0])
    for fragment, args in zip(fragments, received):  # each fragment alone, in PyTorch
        assert all(isinstance(t, torch.Tensor) for t in fragment.graph(*args))
    stitched = stitch(gm, fragments, [f.graph for f in fragments])
    assert torch.equal(stitched(*inputs)[0], gm(*inputs)[0])


def test_a_diamond_around_a_kept_node_is_split_so_that_no_cycle_forms():
    """``a -> cosh -> c`` and ``a -> c``: one fragment holding ``a`` and ``c`` would need
    cosh's output before it can run, so they are two fragments."""

    def diamond(x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x) + 1.0
        return (torch.cosh(a) * a).sum()

    gm = fx.symbolic_trace(diamond)
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    assert len(partitioning.fragments) == 2 and [k.op for k in partitioning.kept] == ["cosh"]
    stitched = stitch(gm, partitioning.fragments, [f.graph for f in partitioning.fragments])
    x = torch.randn(5)
    assert torch.equal(stitched(x), diamond(x))


def test_a_size_read_across_fragments_is_recomputed_not_passed():
    """A fragment reading ``x.shape[0]`` of a tensor outside it takes the tensor and computes
    the size itself: no fragment takes or gives a Python number."""

    class Reshaped(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cosh(x)
            return (y.view(x.shape[0], -1) * 2.0).relu()

    gm, inputs = dynamo_frozen(Reshaped(), torch.randn(3, 4, 5), dynamic=True)
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    for fragment in partitioning.fragments:
        values = [n.meta.get("example_value") for n in fragment.inputs + fragment.outputs]
        assert all(isinstance(v, torch.Tensor) for v in values), fragment.graph.code
    stitched = stitch(gm, partitioning.fragments, [f.graph for f in partitioning.fragments])
    assert torch.equal(stitched(*inputs)[0], gm(*inputs)[0])


def test_a_fragment_counts_the_compute_nodes_the_graph_counts():
    """A write (``setitem``, no users) in a fragment is no compute node there either: every
    compute node is on a runtime or kept, once, so a share on a runtime never passes 1."""

    class Written(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x) * 2.0
            y[:, 0] = 1.0
            return torch.cosh(y * 3.0)

    gm, _ = dynamo_frozen(Written(), torch.randn(3, 4))
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    (fragment,) = partitioning.fragments
    assert "setitem" in [n.name for n in fragment.nodes]
    assert partitioning.ops_on_runtimes + len(partitioning.kept) == partitioning.ops == 4


def test_a_fragment_of_constants_alone_stays_in_pytorch():
    """Nodes that read no input, only a buffer (which a refit may change, so freezing does not
    fold it), beside a kept op would make a runtime fragment without inputs: they stay in
    PyTorch as small, with the reason."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("positions", torch.arange(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = (self.positions * 2 + 1).float()
            return torch.cosh(mask) * x

    gm, _ = dynamo_frozen(Masked(), torch.randn(5))
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    kept = {k.op: k for k in partitioning.kept}
    assert all(f.inputs for f in partitioning.fragments)
    assert kept["mul"].small and "only computes constants" in kept["mul"].reason


def test_tensors_computed_from_no_input_are_folded_and_leave_no_fragment():
    """The same mask from ``arange`` of a static length reads no input and no weight: freezing
    computes it once (graph/input_free.py), and the whole graph goes to the runtime."""

    class Masked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = (torch.arange(5) * 2 + 1).float()
            return torch.cosh(mask) * x

    x = torch.randn(5)
    gm, inputs = dynamo_frozen(Masked(), x)
    partitioning = partition_graph(gm, ["onnxruntime"], min_ops=1)
    assert not partitioning.kept and len(partitioning.fragments) == 1
    assert not any(n.target is torch.arange for n in gm.graph.nodes)
    assert torch.equal(gm(*inputs)[0], Masked()(x))


class _LastToken(nn.Module):
    """Last-token pooling: one indexing reads a float and two integer tensors, ``arange``
    (OpenVINO takes it) and ``(lengths * 3 - 1) // 3`` (an int64 product that may leave int32, which
    OpenVINO leaves to ONNX Runtime)."""

    def forward(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return h[torch.arange(h.shape[0]), (lengths * 3 - 1) // 3] * 2.0


def test_an_indexing_read_by_fragments_of_two_runtimes_is_placed_once_and_not_pulled():
    """torch.fx's partitioner moves the ``getitem`` users of a node into its partition, as it
    should the picks of a multi-output op; for indexing from two partitions it moved back and
    forth without end. Here the partition ends, and the indexing lands where its own row says."""
    h, lengths = torch.randn(4, 5), torch.tensor([1, 2, 3, 4])
    gm, inputs = dynamo_frozen(_LastToken().eval(), h, lengths, dynamic=True)
    partitioning = partition_graph(gm, ["openvino", "onnxruntime"], min_ops=1)
    placed = {n.name: f.runtime for f in partitioning.fragments for n in f.nodes}
    assert placed["mul"] == "onnxruntime" and placed["arange"] == "openvino", placed
    assert not partitioning.kept
    fragments = partitioning.fragments
    stitched = stitch(gm, fragments, [f.graph for f in fragments])
    assert torch.equal(stitched(*inputs)[0], _LastToken()(h, lengths))
    assert not any(n.target is indexing for n in gm.graph.nodes), "the graph is restored"
