"""Image classifiers of the zoo, hand-written in plain ``torch.nn`` (torchvision cannot be imported
in CI): the layouts of ResNet-18/50, MobileNetV2/V3, EfficientNet-lite/B0, VGG, DenseNet,
SqueezeNet, ShuffleNetV2 and Inception at small widths on 32x32 images.

Each keeps the layer types and idioms its namesake's graph holds (``nn.ReLU6``, which Dynamo
records as ``hardtanh``; depthwise convs; squeeze-excite gates; ``AvgPool2d``; concatenations;
``ceil_mode`` pooling; a channel shuffle), since those decide where a graph can run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tests.models import MobileNetLike, ResNetLike

__all__ = ["MODELS"]

Act = Callable[[], nn.Module]


def _image(size: int = 32) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, size, size),)


def _cbr(cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1, act: Act = nn.ReLU):
    """Conv (no bias), BatchNorm, activation."""
    conv = nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), act())


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (strided), 1x1 expand x4, projection shortcut."""

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            _cbr(cin, width, 1),
            _cbr(width, width, 3, stride),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        out += self.shortcut(x)
        return self.relu(out)


def resnet50():
    stem = nn.Sequential(_cbr(3, 16, 7, 2), nn.MaxPool2d(3, 2, 1))
    blocks = [Bottleneck(16, 8), Bottleneck(32, 8), Bottleneck(32, 16, 2), Bottleneck(64, 16)]
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return nn.Sequential(stem, *blocks, head), _image()


class SqueezeExcite(nn.Module):
    """Global pool, reduce, activation, expand, gate (``gate``: sigmoid or hardsigmoid)."""

    def __init__(self, channels: int, reduced: int, act: Act, gate: Act) -> None:
        super().__init__()
        self.fc = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, reduced, 1),
            act(),
            nn.Conv2d(reduced, channels, 1),
            gate(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(x)


class MBConv(nn.Module):
    """Inverted residual: expand 1x1, depthwise kxk, optional squeeze-excite, linear project."""

    def __init__(
        self, cin: int, cout: int, expand: int, k: int, stride: int, act: Act, se: bool = False
    ) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [_cbr(cin, hidden, 1, act=act)] if expand != 1 else []
        layers.append(_cbr(hidden, hidden, k, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden, max(4, cin // 4), act, nn.Sigmoid))
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


def _mbconv_net(act: Act, k: int, se: bool, dropout: float) -> nn.Module:
    blocks = [
        MBConv(16, 16, 1, 3, 1, act, se),
        MBConv(16, 24, 4, k, 2, act, se),
        MBConv(24, 24, 4, k, 1, act, se),
        MBConv(24, 32, 4, 3, 2, act, se),
    ]
    head = nn.Sequential(
        _cbr(32, 64, 1, act=act),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(64, 10),
    )
    return nn.Sequential(_cbr(3, 16, 3, 2, act=act), *blocks, head)


def mobilenet_v2():
    return _mbconv_net(nn.ReLU6, 3, se=False, dropout=0.2), _image()


def efficientnet_lite():
    """EfficientNet-lite: ReLU6, 5x5 depthwise kernels, no squeeze-excite."""
    return _mbconv_net(nn.ReLU6, 5, se=False, dropout=0.2), _image()


def efficientnet_b0():
    """EfficientNet-B0: SiLU, 5x5 depthwise kernels, sigmoid squeeze-excite."""
    return _mbconv_net(nn.SiLU, 5, se=True, dropout=0.2), _image()


def vgg():
    """VGG with average pooling between stages and a dropout classifier."""
    cfg = [(3, 16), (16, 16), "pool", (16, 32), (32, 32), "pool", (32, 64), "pool"]
    layers = [nn.AvgPool2d(2) if c == "pool" else _cbr(*c) for c in cfg]
    head = nn.Sequential(
        nn.Flatten(),
        nn.Linear(64 * 16, 64),
        nn.ReLU(True),
        nn.Dropout(),
        nn.Linear(64, 10),
    )
    return nn.Sequential(*layers, head), _image()


class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1-BN-ReLU-conv3x3, its output concatenated to its input."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth),
            nn.ReLU(),
            nn.Conv2d(4 * growth, growth, 3, 1, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


def densenet():
    def transition(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2)
        )

    layers = [_cbr(3, 16, 3, 2)]
    layers += [DenseLayer(16 + 8 * i, 8) for i in range(3)] + [transition(40, 20)]
    layers += [DenseLayer(20 + 8 * i, 8) for i in range(3)]
    head = nn.Sequential(
        nn.BatchNorm2d(44), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(44, 10)
    )
    return nn.Sequential(*layers, head), _image()


class Fire(nn.Module):
    """SqueezeNet's fire module: squeeze 1x1, then 1x1 and 3x3 expands concatenated."""

    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(True))
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(True))
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU(True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.e1(x), self.e3(x)], 1)


def squeezenet():
    """SqueezeNet 1.1: ``ceil_mode`` max pooling, fire modules, a conv classifier."""
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2),
        nn.ReLU(True),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 8, 16),
        Fire(32, 8, 16),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(32, 12, 24),
        nn.Dropout(0.5),
        nn.Conv2d(48, 10, 1),
        nn.ReLU(True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    return model, _image()


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: split the channels (stride 1) or branch twice (stride 2), concatenate,
    shuffle the channels (view, transpose, view)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        half = cout // 2
        self.stride = stride
        self.left = nn.Identity()
        if stride == 2:
            self.left = nn.Sequential(
                _cbr(cin, cin, 3, 2, groups=cin, act=nn.Identity), _cbr(cin, half, 1)
            )
        right_in = cin if stride == 2 else half
        self.right = nn.Sequential(
            _cbr(right_in, half, 1),
            _cbr(half, half, 3, stride, groups=half, act=nn.Identity),
            _cbr(half, half, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.right(b)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        n, c, h, w = out.shape
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


def shufflenet_v2():
    model = nn.Sequential(
        _cbr(3, 16, 3, 2),
        nn.MaxPool2d(3, 2, 1),
        ShuffleUnit(16, 32, 2),
        ShuffleUnit(32, 32, 1),
        ShuffleUnit(32, 64, 2),
        ShuffleUnit(64, 64, 1),
        _cbr(64, 64, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return model, _image()


class InceptionBlock(nn.Module):
    """Four branches concatenated: 1x1; 1x1-5x5; 1x1-3x3-3x3; 3x3 average pool-1x1."""

    def __init__(self, cin: int, width: int) -> None:
        super().__init__()
        self.b1 = _cbr(cin, width, 1)
        self.b5 = nn.Sequential(_cbr(cin, width, 1), _cbr(width, width, 5))
        self.b3 = nn.Sequential(_cbr(cin, width, 1), _cbr(width, width), _cbr(width, width))
        self.pool = nn.Sequential(
            nn.AvgPool2d(3, 1, 1, count_include_pad=False), _cbr(cin, width, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.pool(x)], 1)


def inception():
    model = nn.Sequential(
        _cbr(3, 16, 3, 2),
        nn.MaxPool2d(3, 2),
        InceptionBlock(16, 8),
        InceptionBlock(32, 8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(32, 10),
    )
    return model, _image()


MODELS = {
    "resnet18": lambda: (ResNetLike(), _image()),
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3": lambda: (MobileNetLike(), _image()),
    "efficientnet_lite": efficientnet_lite,
    "efficientnet_b0": efficientnet_b0,
    "vgg": vgg,
    "densenet": densenet,
    "squeezenet": squeezenet,
    "shufflenet_v2": shufflenet_v2,
    "inception": inception,
}
