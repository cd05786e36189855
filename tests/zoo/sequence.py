"""Sequence, audio, point-cloud and activation models of the zoo, hand-written in plain
``torch.nn``: a wav2vec2-style feature extractor, a TCN of dilated causal conv1d, a text CNN over
an embedding, a PointNet, and small CNNs built around Mish, ELU and PReLU.

They hold ``Conv1d`` (strided, dilated, grouped), ``GroupNorm`` over one channel per group,
GELU, left padding by ``F.pad``, an int64 embedding lookup, max over time and points, and the
activations issue 50 found kept in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS"]


class Wav2Vec2Features(nn.Module):
    """wav2vec2's feature encoder: conv1d (k10 s5) with a per-channel GroupNorm and GELU, strided
    conv1d-GELU layers, LayerNorm and projection, then the grouped positional conv (an even kernel
    whose extra last step is sliced off) added back."""

    def __init__(self, dim: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.first = nn.Sequential(
            nn.Conv1d(1, dim, 10, 5, bias=False), nn.GroupNorm(dim, dim), nn.GELU()
        )
        self.convs = nn.Sequential(
            *[m for _ in range(3) for m in (nn.Conv1d(dim, dim, 3, 2, bias=False), nn.GELU())]
        )
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, hidden)
        self.pos_conv = nn.Conv1d(hidden, hidden, 16, padding=8, groups=4)
        self.out_norm = nn.LayerNorm(hidden)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = self.convs(self.first(audio[:, None])).transpose(1, 2)
        x = self.proj(self.norm(x))
        pos = F.gelu(self.pos_conv(x.transpose(1, 2))[:, :, :-1])
        return self.out_norm(x + pos.transpose(1, 2))


class TemporalBlock(nn.Module):
    """A TCN residual block: two causal dilated conv1d (left padding), ReLU, dropout."""

    def __init__(self, cin: int, cout: int, dilation: int, k: int = 3) -> None:
        super().__init__()
        self.pad = (k - 1) * dilation
        self.conv1 = nn.Conv1d(cin, cout, k, dilation=dilation)
        self.conv2 = nn.Conv1d(cout, cout, k, dilation=dilation)
        self.drop = nn.Dropout(0.2)
        self.down = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(F.relu(self.conv1(F.pad(x, (self.pad, 0)))))
        y = self.drop(F.relu(self.conv2(F.pad(y, (self.pad, 0)))))
        return F.relu(y + self.down(x))


class TCN(nn.Module):
    def __init__(self, channels: int = 6, width: int = 16) -> None:
        super().__init__()
        blocks = [TemporalBlock(channels if i == 0 else width, width, 2**i) for i in range(3)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)[:, :, -1])


class TextCNN(nn.Module):
    """Kim's text CNN: embedding, conv1d of widths 2-4 with ReLU, max over time, linear."""

    def __init__(self, vocab: int = 100, dim: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.convs = nn.ModuleList([nn.Conv1d(dim, width, k) for k in (2, 3, 4)])
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(3 * width, 3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).transpose(1, 2)
        return self.head(torch.cat([F.relu(c(x)).amax(-1) for c in self.convs], 1))


class PointNet(nn.Module):
    """A shared per-point MLP as 1x1 conv1d with BatchNorm, max over points, an MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(3, 16, 1),
            nn.BatchNorm1d(16),
            nn.ReLU(),
            nn.Conv1d(16, 64, 1),
            nn.BatchNorm1d(64),
            nn.ReLU(),
        )
        self.head = nn.Sequential(
            nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 5)
        )

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.head(torch.max(self.features(points), 2)[0])


def _activation_cnn(act: Callable[[int], nn.Module]) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Conv-BN-activation twice, a residual conv, pooling and a head, all with ``act(channels)``."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), act(16))
            self.block = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.BatchNorm2d(16), act(16))
            self.head = nn.Sequential(nn.Linear(16, 16), act(16), nn.Linear(16, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            x = x + self.block(x)
            return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))

    return Net(), (torch.randn(2, 3, 32, 32),)


MODELS = {
    "wav2vec2_features": lambda: (Wav2Vec2Features(), (torch.randn(2, 800),)),
    "tcn": lambda: (TCN(), (torch.randn(2, 6, 64),)),
    "text_cnn": lambda: (TextCNN(), (torch.randint(1, 100, (2, 24)),)),
    "pointnet": lambda: (PointNet(), (torch.randn(2, 3, 128),)),
    "mish_net": lambda: _activation_cnn(lambda _: nn.Mish()),
    "elu_net": lambda: _activation_cnn(lambda _: nn.ELU()),
    "prelu_net": lambda: _activation_cnn(nn.PReLU),
}
