"""What a compiled subgraph keeps alive (:mod:`embedl_dynamo.dynamo.compile`): the runtime and
its artifact, not the graphs the artifact was judged against. For an LLM each of those graphs
holds a full copy of the weights, once per graph Dynamo compiles."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from embedl_dynamo.quant.weight_only.linear import WeightOnlyLinear

pytest.importorskip("onnxruntime")


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_the_judged_weight_only_graph_is_not_kept_once_compiled(tmp_path):
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(2, 64)
    options = {"precision": "int8_weight_only", "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)
    with torch.no_grad():
        out = compiled(x)
        expected = model(x)
    gc.collect()
    assert torch.nn.functional.cosine_similarity(out.flatten(), expected.flatten(), 0) > 0.999
    alive = [o for o in gc.get_objects() if type(o) is WeightOnlyLinear]
    assert alive == []  # the ONNX Runtime session holds the integer weights; PyTorch does not
