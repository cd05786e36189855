"""Weights updated through ``.data`` after compiling are seen on the next call (issue 39 item 1).

``.data`` writes do not move a tensor's version counter, so before, the compiled model kept
computing with the weights it froze, with no warning. Each idiom of weight loaders, EMA/SWA,
pruning and older fine-tuning code must give eager's numbers after it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from embedl_dynamo.dynamo import compiled_call
from embedl_dynamo.dynamo.frozen_weights import (
    RUN_BYTES,
    SAMPLED_RUNS,
    SMALL_BYTES,
    FrozenWeights,
)
from tests.helpers import BUILD_COUNTS, assert_close_to_scale

X = torch.randn(2, 3, 8, 8)


class ConvBNNet(nn.Module):
    """conv -> BatchNorm -> relu -> mean -> linear: parameters and buffers, one small, one
    larger than :data:`SMALL_BYTES` (``head``: sampled, not compared whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.wide = nn.Linear(8, 512)
        self.head = nn.Linear(512, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.head(torch.relu(self.wide(y)))


def _set_data(model: ConvBNNet) -> None:
    model.conv.weight.data = model.conv.weight.data * 2


def _data_copy(model: ConvBNNet) -> None:
    model.head.weight.data.copy_(torch.randn_like(model.head.weight))


def _data_mul(model: ConvBNNet) -> None:
    model.wide.weight.data.mul_(2)


def _buffer_data_add(model: ConvBNNet) -> None:
    model.bn.running_mean.data.add_(1)


def _vector_to_parameters(model: ConvBNNet) -> None:
    vector = nn.utils.parameters_to_vector(model.parameters())
    nn.utils.vector_to_parameters(vector * 1.5, model.parameters())


IDIOMS = {
    "p.data = new": _set_data,
    "p.data.copy_(new)": _data_copy,
    "p.data.mul_(2)": _data_mul,
    "buf.data.add_(1)": _buffer_data_add,
    "vector_to_parameters": _vector_to_parameters,
}


def _check(update, backend: str) -> None:
    torch.manual_seed(0)
    model = ConvBNNet().eval()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close_to_scale(compiled(X), model(X))
        before = model(X)
        update(model)
        assert not torch.allclose(model(X), before), "the idiom changed nothing"
        for _ in range(2):  # the refitted (or rebuilt) artifact, then nothing more
            assert_close_to_scale(compiled(X), model(X))
    assert BUILD_COUNTS["onnx"] + BUILD_COUNTS["refit"] == 2


@pytest.mark.parametrize("name", list(IDIOMS))
def test_data_write_is_seen_on_onnxruntime(name):
    _check(IDIOMS[name], "embedl_onnxruntime")


@pytest.mark.parametrize("name", ["p.data.mul_(2)", "vector_to_parameters"])
def test_data_write_is_seen_on_openvino(name):
    pytest.importorskip("openvino")
    _check(IDIOMS[name], "embedl_openvino")


def test_a_data_write_warns_once_naming_what_is_not_seen(monkeypatch):
    monkeypatch.setattr(compiled_call, "_warned_data_write", False)
    model = ConvBNNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(X)
        for _ in range(2):
            model.wide.weight.data.mul_(2)
            compiled(X)
    messages = [str(w.message) for w in caught if ".data" in str(w.message)]
    assert len(messages) == 1, messages
    assert "not seen" in messages[0] and "p.copy_(new)" in messages[0]


def test_the_sample_covers_a_small_weight_whole_and_a_large_one_in_places():
    small = torch.zeros(SMALL_BYTES // 4 - 1)  # 1020 bytes: not a multiple of 8
    large, scalar = torch.zeros(4096), torch.zeros(())
    args = [small, large, scalar]
    weights = FrozenWeights(args, [])
    assert weights.changed(args) is None
    step = (large.nbytes - RUN_BYTES) // (SAMPLED_RUNS - 1) // 4  # between runs, in elements
    last_of_second_run = step + RUN_BYTES // 4 - 1
    for tensor, position in (
        (small, -1),
        (small, 1),
        (large, 0),
        (large, last_of_second_run),
        (large, -1),
    ):
        tensor.data[position] = 1.0  # through .data: no version bump
        assert weights.changed(args) is not None
        tensor.data[position] = 0.0
        assert weights.changed(args) is None
    scalar.data.fill_(2.0)
    assert weights.changed(args) is not None
