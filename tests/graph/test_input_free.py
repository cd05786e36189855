"""Freezing folds the tensors a graph computes from no input (graph/input_free.py): what is
folded, what is not and why, and that the folded graph computes what the model does."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import embedl_dynamo.graph.input_free as input_free
from embedl_dynamo.graph.input_free import FOLDED_PREFIX, fold_input_free
from tests.helpers import dynamo_frozen


def _folded(gm: fx.GraphModule) -> list[torch.Tensor]:
    return [
        getattr(gm, str(n.target))
        for n in gm.graph.nodes
        if n.op == "get_attr" and str(n.target).startswith(FOLDED_PREFIX)
    ]


def _ops(gm: fx.GraphModule) -> set[str]:
    return {getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes}


class RelativeBuckets(nn.Module):
    """T5-style buckets: int64 arithmetic, ``sign``, a cast of a logarithm, all from ``arange``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-1])
        relative = positions[None, :] - positions[:, None]
        large = (torch.log(relative.abs().float() + 1) * 3).to(torch.int64)
        buckets = torch.sign(relative) * torch.minimum(large, torch.full_like(large, 7)) + 8
        return x @ x.transpose(-1, -2) + buckets.float()


def test_tensors_from_no_input_are_computed_once_and_equal_the_model():
    x = torch.randn(2, 6, 6)
    gm, inputs = dynamo_frozen(RelativeBuckets().eval(), x)
    assert [tuple(t.shape) for t in _folded(gm)] == [(6, 6)]
    assert not {"arange", "sign", "log", "minimum"} & _ops(gm)
    assert torch.equal(gm(*inputs)[0], RelativeBuckets()(x))


class FromInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.arange(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from_buffer = (self.offsets * 2).float()  # a buffer may change: refit, not folding
        random = torch.rand(4)  # another value on each call
        empty = torch.zeros(0)  # a cache's empty start: nothing to gain
        x = torch.cat([torch.zeros(0), x])  # a legacy empty tensor, which cat takes beside any
        returned = torch.arange(4).view(2, 2)  # each call returns a tensor of its own
        return x + from_buffer + random.sum() * 0 + empty.sum(), returned


def test_what_reads_a_weight_is_random_empty_or_returned_is_not_folded():
    gm, _ = dynamo_frozen(FromInputs().eval(), torch.randn(4))
    assert [t.tolist() for t in _folded(gm)] == [0.0]  # only the empty tensor's sum
    assert {"rand", "zeros", "arange", "mul", "view"} <= _ops(gm)


def test_a_returned_constant_is_a_new_tensor_on_every_call():
    gm, inputs = dynamo_frozen(FromInputs().eval(), torch.randn(4))
    first, second = gm(*inputs)[1], gm(*inputs)[1]
    first.add_(1)
    assert torch.equal(second, torch.arange(4).view(2, 2))


def test_a_tensor_over_the_size_bound_stays_computed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(input_free, "MAX_FOLDED_BYTES", 8 * 5)
    x = torch.randn(2, 6, 6)
    gm, inputs = dynamo_frozen(RelativeBuckets().eval(), x)  # 36 elements of 4 bytes
    assert not _folded(gm) and "arange" in _ops(gm)
    assert torch.equal(gm(*inputs)[0], RelativeBuckets()(x))


def test_with_a_dynamic_length_nothing_is_constant():
    x = torch.randn(2, 6, 6)
    gm, inputs = dynamo_frozen(RelativeBuckets().eval(), x, dynamic=True)
    assert not _folded(gm) and "arange" in _ops(gm)


def test_folding_twice_finds_nothing_more():
    gm, _ = dynamo_frozen(RelativeBuckets().eval(), torch.randn(2, 6, 6))
    assert fold_input_free(gm) == 0


class _ChunkCount(nn.Module):
    """Longformer's chunk count: ``torch.div`` of two ints, a 0-d tensor read as a size by
    ``view`` and ``new_zeros``, and as a tensor by ``add``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.div(x.shape[1], 4, rounding_mode="trunc")
        blocks = x.view(x.shape[0], chunks, 4)
        return blocks + blocks.new_zeros((x.shape[0], chunks, 4)) + chunks


def test_a_folded_integer_read_as_a_size_is_a_python_int_there():
    x = torch.randn(2, 8)
    gm, inputs = dynamo_frozen(_ChunkCount(), x)
    sizes = [n for n in gm.graph.nodes if n.target in ("view", "new_zeros")]
    assert [n.args[1:] for n in sizes] == [(2, 2, 4), ((2, 2, 4),)]
    (folded,) = _folded(gm)  # the add reads it as a tensor: it stays a constant there
    assert torch.equal(folded, torch.tensor(2))
    (out,) = gm(*inputs)
    assert torch.equal(out, _ChunkCount()(x))


def test_input_free_value_evaluates_constants_alone_and_nothing_that_reads_an_input():
    graph = fx.Graph()
    x = graph.placeholder("x")
    chunks = graph.call_function(torch.div, (32, 8), {"rounding_mode": "trunc"})
    assert torch.equal(input_free.input_free_value(chunks), torch.tensor(4))
    assert input_free.input_free_value(graph.call_function(torch.add, (x, chunks))) is None


class _DiagonalMasks(nn.Module):
    """Longformer's masks of its diagonals: fills of the scores' static shape, a triangle and
    its flip, cast to ``bool`` (which OpenVINO computes otherwise on a NaN), then written into
    the scores."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        mask = scores.new_ones(3, 4).tril().flip(dims=[0])[None, :, :].expand(2, 3, 4)
        start = scores[:, :3, :4]
        scores[:, :3, :4] = torch.full_like(start, -float("inf")).where(mask.bool(), start)
        return scores.softmax(-1)


def test_a_fill_of_a_static_shape_reads_no_input_and_folds_with_what_it_feeds():
    scores = torch.randn(2, 5, 6)
    gm, inputs = dynamo_frozen(_DiagonalMasks().eval(), scores)
    assert not {"tril", "flip", "bool"} & _ops(gm)
    assert any(t.dtype == torch.bool and t.shape == (2, 3, 4) for t in _folded(gm))
    assert torch.equal(gm(*inputs)[0], _DiagonalMasks()(scores))


class _Fills(nn.Module):
    """Fills read directly by the graph, with their value given by position and by keyword."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        made = (x + torch.full_like(x, fill_value=2.0)) * x.new_full((4, 4), 3)
        ordered = torch.ones_like(x.t()).cumsum(0)  # the fill keeps the transposed strides
        return made, x * ordered


def test_a_fill_the_graph_reads_directly_stays_made_and_one_read_through_ops_folds():
    x = torch.randn(4, 4)
    gm, inputs = dynamo_frozen(_Fills().eval(), x)
    assert {"full_like", "new_full"} <= _ops(gm)  # stored, they would cost a read
    assert "cumsum" not in _ops(gm)
    made, ordered = gm(*inputs)
    expected = _Fills()(x)
    assert torch.equal(made, expected[0]) and torch.equal(ordered, expected[1])


def test_a_fill_whose_value_is_computed_or_whose_shape_is_dynamic_is_not_folded():
    class ComputedValue(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.full_like(x, x.shape[0]).cumsum(0) + torch.ones_like(x).cumsum(0) * x

    x = torch.randn(3, 4)
    gm, _ = dynamo_frozen(ComputedValue().eval(), x, dynamic=True)
    assert not _folded(gm) and {"full_like", "ones_like", "cumsum"} <= _ops(gm)


def test_a_fill_written_in_place_is_not_folded():
    class Written(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            made = x.new_zeros(4, 4)
            made[1:3] += 1
            return x + made.cumsum(0)

    x = torch.randn(4, 4)
    gm, inputs = dynamo_frozen(Written().eval(), x)
    assert {"new_zeros", "cumsum"} <= _ops(gm)  # the written fill and what reads it stay made
    assert torch.equal(gm(*inputs)[0], Written()(x))
