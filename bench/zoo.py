"""Real architectures for benchmarks: torchvision, timm and transformers, random weights.

Random initialisation leaves BatchNorm's running statistics at mean 0, variance 1, so nothing
normalises the activations: in torchvision's MobileNetV2/V3 and EfficientNet-B0 they shrink
block by block and the logits come out at 1e-9..1e-14 (ResNet-50's at 1e2). No trained network
looks like that, and no precision can be judged on it. :func:`settle_batch_norm` therefore runs
a few random batches through each CNN in training mode first (cumulative BatchNorm averages,
no gradients), as a data-free stand-in for trained statistics; the weights stay random.

torchvision's only reachable wheel is a CUDA build whose meta registrations expect two C++ op
schemas the CPU torch lacks; :func:`import_model_libraries` defines them first (FACTS.md), after
which torchvision, timm and transformers import and build models on CPU. Install them with
``pip install -c constraints.txt -e ".[bench]"``. Unit tests never need them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SMOKE_ZOO", "ZOO", "import_model_libraries", "settle_batch_norm"]

_LIBRARY: Any = None


def import_model_libraries() -> None:
    """Make torchvision (and so timm, transformers) importable with the CPU torch."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "DEF")
        _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARY.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def settle_batch_norm(
    model: torch.nn.Module, example: torch.Tensor, batches: int = 4, batch_size: int = 8
) -> torch.nn.Module:
    """Set every BatchNorm's running statistics from random batches shaped like ``example``.

    Returns ``model`` in eval mode; a model without BatchNorm is returned unchanged.
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model.eval()
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches
    generator = torch.Generator().manual_seed(1234)
    shape = (batch_size, *example.shape[1:])
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(shape, generator=generator))
    return model.eval()


def _torchvision(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def build():
        import_model_libraries()
        import torchvision

        x = torch.randn(1, 3, 224, 224)
        return settle_batch_norm(getattr(torchvision.models, name)(weights=None), x), (x,)

    return build


def _timm(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def build():
        import_model_libraries()
        import timm

        x = torch.randn(1, 3, 224, 224)
        return settle_batch_norm(timm.create_model(name, pretrained=False), x), (x,)

    return build


def _tiny_cnn():
    """Conv-BN-ReLU twice, a residual add, pooling and a linear head on 32x32 images: a model
    that compiles in seconds, for smoke runs of the benchmark scripts (no torchvision)."""
    nn = torch.nn

    class TinyCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            self.block = nn.Sequential(
                nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()
            )
            self.head = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            x = x + self.block(x)
            return self.head(x.mean((2, 3)))

    x = torch.randn(1, 3, 32, 32)
    return settle_batch_norm(TinyCNN(), x), (x,)


def _bert():
    import_model_libraries()
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(attn_implementation="sdpa")).eval()
    return model, (torch.randint(0, 30000, (1, 128)),)


def _gpt2():
    import_model_libraries()
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(use_cache=False, attn_implementation="sdpa")).eval()
    return model, (torch.randint(0, 50000, (1, 128)),)


# name -> (family, factory returning (model, example inputs))
ZOO: dict[str, tuple[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]]] = {
    "resnet50": ("cnn", _torchvision("resnet50")),
    "mobilenet_v2": ("cnn", _torchvision("mobilenet_v2")),
    "mobilenet_v3_large": ("cnn", _torchvision("mobilenet_v3_large")),
    "efficientnet_b0": ("cnn", _torchvision("efficientnet_b0")),
    "convnext_tiny": ("cnn", _torchvision("convnext_tiny")),
    "regnet_y_400mf": ("cnn", _torchvision("regnet_y_400mf")),
    "ghostnet_100": ("cnn", _timm("ghostnet_100")),
    "densenet121": ("cnn", _torchvision("densenet121")),
    "vgg11_bn": ("cnn", _torchvision("vgg11_bn")),
    "vit_tiny": ("transformer", _timm("vit_tiny_patch16_224")),
    "vit_small": ("transformer", _timm("vit_small_patch16_224")),
    "deit_tiny": ("transformer", _timm("deit_tiny_patch16_224")),
    "mobilevit_xs": ("transformer", _timm("mobilevit_xs")),
    "bert_base": ("transformer", _bert),
    "gpt2": ("transformer", _gpt2),
}

# models for smoke runs of the benchmark scripts, kept out of ZOO (no script's default set)
SMOKE_ZOO: dict[str, tuple[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]]] = {
    "tiny_cnn": ("cnn", _tiny_cnn),
}
