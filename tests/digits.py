"""scikit-learn's ``load_digits`` (1,797 real 8x8 images) and a small CNN trained on it in seconds.

Shared by the INT8 accuracy tests and the examples: deterministic (fixed seeds, fixed split).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DigitsCNN",
    "DigitsMobileCNN",
    "DigitsViT",
    "accuracy",
    "load_digits_tensors",
    "train_digits_cnn",
]


def load_digits_tensors(seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: images as ``(N, 1, 8, 8)`` floats in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        range(len(y)), test_size=0.3, random_state=seed, stratify=data.target
    )
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


class DigitsCNN(nn.Module):
    """conv-bn-relu x2, a residual block, global pooling and a linear classifier."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)) + x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class DigitsMobileCNN(nn.Module):
    """MobileNetV3 flavour: hardswish stem, an inverted residual with a depthwise conv and
    squeeze-excite, global pooling, a linear classifier."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        hidden = 3 * width
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.Hardswish()
        )
        self.expand = nn.Sequential(
            nn.Conv2d(width, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish()
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
        )
        self.se_reduce = nn.Conv2d(hidden, width // 2, 1)
        self.se_expand = nn.Conv2d(width // 2, hidden, 1)
        self.project = nn.Sequential(nn.Conv2d(hidden, width, 1, bias=False), nn.BatchNorm2d(width))
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.depthwise(self.expand(x))
        scale = F.adaptive_avg_pool2d(y, 1)
        y = y * F.hardsigmoid(self.se_expand(F.relu(self.se_reduce(scale))))
        x = x + self.project(y)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class DigitsViT(nn.Module):
    """A small ViT: 2x2 patch embedding (16 tokens), class token, two pre-norm blocks with
    ``nn.MultiheadAttention`` and a GELU MLP, LayerNorm, a linear head."""

    def __init__(self, dim: int = 32, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 2, 2)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        self.norms1 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.attns = nn.ModuleList(
            nn.MultiheadAttention(dim, heads, batch_first=True) for _ in range(depth)
        )
        self.norms2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for norm1, attn, norm2, mlp in zip(self.norms1, self.attns, self.norms2, self.mlps):
            h = norm1(x)
            x = x + attn(h, h, h, need_weights=False)[0]
            x = x + mlp(norm2(x))
        return self.head(self.norm(x)[:, 0])


def accuracy(model, x: torch.Tensor, y: torch.Tensor, batch: int | None = None) -> float:
    """Top-1 accuracy in percent (in batches of ``batch`` when given, as deployed)."""
    outs = []
    with torch.no_grad():
        for chunk in x.split(batch) if batch else (x,):
            out = model(chunk)
            outs.append(out[0] if isinstance(out, (tuple, list)) else torch.as_tensor(out))
    return float((torch.cat(outs).argmax(1) == y).float().mean()) * 100.0


def train_digits_cnn(
    epochs: int = 8, seed: int = 0, lr: float = 3e-3, make: type[nn.Module] = DigitsCNN
) -> tuple[nn.Module, tuple]:
    """Train ``make()`` (fixed seed); returns the eval-mode model and the data split."""
    torch.manual_seed(seed)
    data = load_digits_tensors(seed)
    x_train, y_train = data[0], data[1]
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x_train), generator=gen)
        for i in range(0, len(perm), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    return model.eval(), data
