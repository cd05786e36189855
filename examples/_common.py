"""Helpers shared by the examples: find the repository's ``bench/models/resnet.py`` ResNet-50."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["resnet"]

REPO = Path(__file__).resolve().parent.parent


def resnet(small: bool, seed: int = 0):
    """ResNet-50 (torchvision layout, random weights, eval mode); ``small``: one block per stage.

    Random BatchNorm statistics make the BN folding non-trivial, so equal outputs mean something.
    """
    import torch

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.models.resnet import ResNet50, resnet50

    if not small:
        return resnet50(seed)
    torch.manual_seed(seed)
    model = ResNet50(num_classes=10, layers=(1, 1, 1, 1))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model.eval()
