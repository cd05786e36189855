"""Negative ``transpose`` dims are written non-negative before export
(:mod:`embedl_dynamo.graph.transpose_dims`): PyTorch's ONNX exporter merged CANINE's
``k.transpose(-1, -2)`` after ``repeat_interleave`` into the wrong permutation."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo.graph.transpose_dims import nonnegative_transpose_dims
from tests.helpers import runtime_compiled


class _RepeatedKeys(nn.Module):
    """CANINE's final character encoder: keys from repeated molecules, transposed twice."""

    def __init__(self) -> None:
        super().__init__()
        self.key, self.query = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, molecules: torch.Tensor) -> torch.Tensor:
        chars = torch.repeat_interleave(molecules, repeats=4, dim=-2)
        batch = chars.shape[0]
        keys = self.key(chars).view(batch, -1, 2, 8).transpose(1, 2)
        queries = self.query(chars).view(batch, -1, 2, 8).transpose(1, 2)
        return torch.matmul(queries, keys.transpose(-1, -2))


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_transposes_after_repeat_interleave_run_on_the_runtime_as_in_eager(runtime):
    torch.manual_seed(0)
    model = _RepeatedKeys().eval()
    compiled = runtime_compiled(model, runtime)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 3, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == [runtime]


def test_only_negative_dims_of_a_known_rank_are_written():
    def f(x):
        return x.transpose(-1, -2) + x.transpose(-3, 1) + x.transpose(0, 2)

    gm = fx.symbolic_trace(f)
    assert nonnegative_transpose_dims(gm) == 0  # no recorded rank: left as it is
    next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"] = torch.ones(3, 3, 3)
    assert nonnegative_transpose_dims(gm) == 2
    calls = [n.args[1:] for n in gm.graph.nodes if n.target == "transpose"]
    assert calls == [(2, 1), (0, 1), (0, 2)]
    x = torch.randn(3, 3, 3)
    assert torch.equal(gm(x), f(x))
