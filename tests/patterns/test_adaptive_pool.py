"""adaptive_pool_matrix: a non-dividing adaptive average pool as two constant matrix products."""

from __future__ import annotations

import torch
from torch import nn

from embedl_dynamo import transform
from embedl_dynamo.patterns.adaptive_pool import AdaptivePoolMatrix, pooling_matrix
from tests.helpers import assert_close_to_scale, assert_same_outputs


class _Pool(nn.Module):
    def __init__(self, size) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


def test_a_non_dividing_pool_becomes_two_matmuls_with_equal_outputs():
    x = torch.randn(2, 3, 4, 5)
    model = _Pool(7).eval()  # VGG's 7x7 from a 4x5 map: neither size divides
    result = transform(model, (x,), [AdaptivePoolMatrix()])
    (entry,) = result.plan.entries
    assert entry.id == "adaptive_pool_matrix@pool" and entry.applied
    targets = [n.target for n in result.model.graph.nodes if n.op == "call_function"]
    assert (
        targets.count(torch.matmul) == 2 and torch.nn.functional.adaptive_avg_pool2d not in targets
    )
    assert_same_outputs(model, result.model, x)


def test_a_dividing_pool_is_left_with_the_reason():
    x = torch.randn(2, 3, 8, 8)
    result = transform(_Pool((2, 4)).eval(), (x,), [AdaptivePoolMatrix()])
    (entry,) = result.plan.entries
    assert not entry.applied
    assert entry.reason == "the output size divides the input: exporters take it as AveragePool"


def test_pooling_matrix_rows_are_pytorch_windows():
    matrix = pooling_matrix(4, 7, torch.float64)
    x = torch.randn(4, dtype=torch.float64)
    want = torch.nn.functional.adaptive_avg_pool1d(x[None, None], 7)[0, 0]
    assert torch.allclose(matrix @ x, want, atol=1e-12)
    assert torch.allclose(matrix.sum(1), torch.ones(7, dtype=torch.float64))


def test_vgg_style_head_at_128_compiles_on_the_runtime():
    import embedl_dynamo

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(32)
            )
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.fc = nn.Linear(8 * 7 * 7, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.features(x)), 1))

    model = Head().eval()
    x = torch.randn(1, 3, 128, 128)  # a 4x4 map before the 7x7 pool
    embedl_dynamo.clear_reports()
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt")(x), model(x))
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "onnxruntime", sub.reason
