"""Models of seconds for smoke runs: a small CNN and an MLP, plain ``torch.nn``.

``tiny_cnn`` (conv-BN-ReLU twice, a residual add, pooling and a linear head on 32x32 images)
compiles in seconds and exercises the CNN path of every variant, so ``python -m bench run
cpu_table --smoke`` tests the harness end to end; ``mlp`` is the serving suite's quick model.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.models.zoo import settle_batch_norm

__all__ = ["TinyCNN", "mlp", "tiny_cnn"]


class TinyCNN(nn.Module):
    """Conv-BN-ReLU, a residual conv-BN-ReLU block, global pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(x.mean((2, 3)))


def tiny_cnn() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """:class:`TinyCNN` (BatchNorm statistics settled) and a 1x3x32x32 input."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    return settle_batch_norm(TinyCNN(), x), (x,)


def mlp() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Linear 64 -> 256, ReLU, linear -> 10, and a batch of 2."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
    return model, (torch.randn(2, 64),)
