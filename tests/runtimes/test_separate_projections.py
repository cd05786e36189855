"""``F.multi_head_attention_forward`` with separate Q/K/V projection weights ignores its
``in_proj_weight``; WavLM passes ``torch.empty([0])`` there. The judge does not count that
unread empty tensor as an op on an empty tensor (which stays in PyTorch), so the attention
runs on the runtime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import embedl_dynamo
from embedl_dynamo.runtimes.conformance import op_name
from tests.helpers import runtime_compiled

EMBED, HEADS = 8, 2


class _SeparateProjections(nn.Module):
    """WavLM's call: separate projection weights, an empty ``in_proj_weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(EMBED, EMBED) for _ in range(3))
        self.out = nn.Linear(EMBED, EMBED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.cat((self.q.bias, self.k.bias, self.v.bias))
        projections = {
            "q_proj_weight": self.q.weight,
            "k_proj_weight": self.k.weight,
            "v_proj_weight": self.v.weight,
        }
        outputs = F.multi_head_attention_forward(
            *(x, x, x, EMBED, HEADS, torch.empty([0]), bias, None, None, False, 0.0),
            *(self.out.weight, self.out.bias),
            training=False,
            need_weights=False,
            use_separate_proj_weight=True,
            **projections,
        )
        return outputs[0]


def _attention_node() -> fx.Node:
    """The attention node of the model's Dynamo graph."""
    captured = []

    def backend(gm: fx.GraphModule, inputs):
        captured.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_SeparateProjections().eval(), backend=backend)(torch.randn(5, 1, EMBED))
    (gm,) = captured
    (node,) = [n for n in gm.graph.nodes if n.target is F.multi_head_attention_forward]
    return node


def test_an_unread_empty_in_proj_weight_leaves_the_attentions_own_name():
    assert op_name(_attention_node()) == "multi_head_attention_forward"


def test_an_empty_in_proj_weight_that_is_read_is_an_op_on_an_empty_tensor():
    node = _attention_node()
    node.update_kwarg("use_separate_proj_weight", False)  # now the joined weight is read
    assert op_name(node) == "empty_tensor"


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_the_attention_runs_on_the_runtime_as_in_eager(runtime):
    torch.manual_seed(0)
    model = _SeparateProjections().eval()
    compiled = runtime_compiled(model, runtime)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5, 2, EMBED)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == [runtime]
