"""Autocast regions that change nothing (:mod:`embedl_dynamo.graph.idle_autocast`): a region
turning autocast off, compiled with autocast off, leaves no node behind and the model runs
whole on the runtime with eager's outputs; a region turning autocast on, or one compiled under
autocast, keeps its nodes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.graph.idle_autocast import drop_idle_autocast
from tests.helpers import dynamo_frozen, dynamo_graph, runtime_compiled


class _Guarded(nn.Module):
    """timm's EfficientViT attention form: a matmul in a region that turns autocast off."""

    def __init__(self, enabled: bool = False) -> None:
        super().__init__()
        self.proj, self.enabled = nn.Linear(8, 8), enabled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x)
        with torch.autocast(device_type=x.device.type, enabled=self.enabled):
            scores = q @ q.transpose(-1, -2)
        return torch.softmax(scores.float(), -1) @ q


def _autocast_nodes(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if "autocast" in str(n.target)]


def test_a_region_turning_autocast_off_leaves_no_node_at_freezing():
    model, x = _Guarded().eval(), torch.randn(2, 4, 8)
    assert len(_autocast_nodes(dynamo_graph(model, x))) == 2  # Dynamo records the region
    gm, inputs = dynamo_frozen(model, x)
    assert _autocast_nodes(gm) == []
    torch.testing.assert_close(gm(*inputs)[0], model(x), rtol=0, atol=0)


def test_a_region_that_changes_the_numbers_keeps_its_nodes():
    model, x = _Guarded(enabled=True).eval(), torch.randn(2, 4, 8)
    gm = dynamo_graph(model, x)
    assert drop_idle_autocast(gm.graph) == 0  # autocast on inside: bfloat16 matmul
    assert len(_autocast_nodes(gm)) == 2
    gm = dynamo_graph(_Guarded().eval(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # off inside, on around it
        assert drop_idle_autocast(gm.graph) == 0
    assert drop_idle_autocast(gm.graph) == 1 and _autocast_nodes(gm) == []


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_the_model_runs_whole_on_the_runtime_with_eagers_outputs(runtime):
    model, x = _Guarded().eval(), torch.randn(2, 4, 8)
    compiled = runtime_compiled(model, runtime)
    for seed in range(2):
        x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    assert (sub.runtime, sub.kept) == (runtime, [])
