"""Freezing Dynamo graphs: constants under their module paths, user inputs, training detection."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.graph.freeze import freeze, inference_blocker
from tests.models import ResNetLike, randomize_batchnorm


def _dynamo_graph(model, *inputs, dynamic=None, frozen=False):
    """The last graph Dynamo hands a backend (frozen inside the backend when ``frozen``)."""
    graphs = []

    def record(gm, example_inputs, **_):
        example_inputs = list(example_inputs)
        graphs.append((freeze(gm, example_inputs) if frozen else gm, example_inputs))
        return gm.forward

    torch.compile(model, backend=record, dynamic=dynamic)(*inputs)
    return graphs[-1]


def test_parameters_become_constants_named_by_module_path():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    frozen, inputs = _dynamo_graph(model, x, frozen=True)
    placeholders = [n for n in frozen.gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1 and len(frozen.user_inputs) == 1
    assert inputs[frozen.user_inputs[0]] is x
    targets = {str(n.target) for n in frozen.gm.graph.nodes if n.op == "get_attr"}
    assert {"conv1.weight", "layer1.0.bn1.running_var", "layer2.0.downsample.0.weight"} <= targets
    assert targets == set(dict(model.state_dict()).keys()) - {
        k for k in model.state_dict() if k.endswith("num_batches_tracked")
    }
    # shares memory with the model (no copy), the model is untouched
    w = frozen.gm.get_buffer("conv1.weight")
    assert w.data_ptr() == model.conv1.weight.data_ptr() and not w.requires_grad
    assert model.conv1.weight.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(frozen.gm(x)[0], model(x), rtol=0, atol=0)


def test_symbolic_batch_input_is_read_from_the_tensor():
    """A second batch size makes Dynamo recompile with a symbolic batch (an extra SymInt input)."""
    model = ResNetLike().eval()
    graphs = []

    def record(gm, example_inputs, **_):
        graphs.append((freeze(gm, list(example_inputs)), list(example_inputs)))
        return gm.forward

    compiled = torch.compile(model, backend=record)
    compiled(torch.randn(2, 3, 16, 16))
    compiled(torch.randn(3, 3, 16, 16))
    frozen, inputs = graphs[-1]
    assert any(isinstance(v, torch.SymInt) for v in inputs)
    assert [type(inputs[i]) for i in frozen.user_inputs] == [torch.Tensor]
    x = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(frozen.gm(x)[0], model(x))


def test_training_mode_is_detected():
    model = ResNetLike().train()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 16, 16))
    assert "batch_norm runs in training mode" in inference_blocker(gm, inputs)


def test_input_requiring_grad_is_detected():
    model = ResNetLike().eval()
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    gm, inputs = _dynamo_graph(model, x)
    assert "requires grad" in inference_blocker(gm, inputs)
    with torch.no_grad():
        assert inference_blocker(gm, inputs) is None


def test_eval_model_has_no_blocker_under_no_grad_but_trainable_weights_block_grad_mode():
    model = ResNetLike().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 16, 16))
    with torch.no_grad():
        assert inference_blocker(gm, inputs) is None
    reason = inference_blocker(gm, inputs)  # grad mode on, weights require grad
    assert reason is not None and reason.startswith("parameter ")
    assert "requires grad while grad mode is on" in reason


def test_freeze_checks_input_count():
    model = ResNetLike().eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 16, 16))
    with pytest.raises(ValueError, match="placeholders but"):
        freeze(gm, inputs[:-1])


def test_capture_returns_frozen_single_graph():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    gm = capture(model, (x,))
    assert [n.op for n in gm.graph.nodes].count("placeholder") == 1
    with torch.no_grad():
        torch.testing.assert_close(gm(x)[0], model(x), rtol=0, atol=0)


def test_capture_reports_graph_breaks():
    from tests.models import GraphBreakNet

    with pytest.raises(RuntimeError, match="could not capture GraphBreakNet as one graph"):
        capture(GraphBreakNet().eval(), (torch.randn(1, 3, 8, 8),))


class _DeviceKeyedCache(nn.Module):
    """timm's LeViT / EfficientFormer keep attention biases in a dict keyed by device ('cpu')."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.attention_biases = nn.Parameter(torch.randn(4))
        self.attention_bias_cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.attention_bias_cache:
            self.attention_bias_cache[key] = self.attention_biases * 2
        return torch.relu(self.fc(x)) + self.attention_bias_cache[key]


def test_a_constant_named_like_a_module_method_compiles():
    """Regression (issue 23 item 11): freezing raised KeyError "attribute 'cpu' already
    exists" out of torch.compile."""
    model = _DeviceKeyedCache().eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x)  # fills the cache, as a model's first call does
        got = torch.compile(model, backend="embedl_onnxruntime")(x)
        torch.testing.assert_close(got, model(x))
    assert embedl_dynamo.last_report().subgraphs[0].runtime == "onnxruntime"
