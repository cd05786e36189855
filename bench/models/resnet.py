"""ResNet-50 in plain ``torch.nn``, for probes that must run without torchvision.

``resnet50()`` has torchvision's ResNet-50 layout (bottleneck blocks [3, 4, 6, 3], 25.6 M
parameters) with random weights and randomised BatchNorm statistics, in eval mode; registered
as ``resnet50_nn`` (:func:`example`: with a 224x224 input).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Bottleneck", "ResNet50", "example", "resnet50"]


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4), with a projection shortcut when needed."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    """ResNet-50: stem, four stages of bottlenecks [3, 4, 6, 3], global pool, fc."""

    def __init__(self, num_classes: int = 1000, layers: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = 64, []
        for index, (blocks, width) in enumerate(zip(layers, (64, 128, 256, 512))):
            stride = 1 if index == 0 else 2
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(seed: int = 0) -> ResNet50:
    """A ResNet-50 with random weights and non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = ResNet50()
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
    return model.eval()


def example() -> tuple[ResNet50, tuple[torch.Tensor]]:
    """:func:`resnet50` and a seeded 1x3x224x224 input."""
    model = resnet50()
    return model, (torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),)
