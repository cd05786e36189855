"""Real architectures for benchmarks: torchvision, timm and transformers, random weights.

torchvision's only reachable wheel is a CUDA build whose meta registrations expect two C++ op
schemas the CPU torch lacks; :func:`import_model_libraries` defines them first (FACTS.md), after
which torchvision, timm and transformers import and build models on CPU. Install them with
``pip install -c constraints.txt -e ".[bench]"``. Unit tests never need them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ZOO", "import_model_libraries"]

_LIBRARY: Any = None


def import_model_libraries() -> None:
    """Make torchvision (and so timm, transformers) importable with the CPU torch."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "DEF")
        _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARY.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _torchvision(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def build():
        import_model_libraries()
        import torchvision

        return getattr(torchvision.models, name)(weights=None).eval(), (
            torch.randn(1, 3, 224, 224),
        )

    return build


def _timm(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def build():
        import_model_libraries()
        import timm

        return timm.create_model(name, pretrained=False).eval(), (torch.randn(1, 3, 224, 224),)

    return build


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
    "deit_tiny": ("transformer", _timm("deit_tiny_patch16_224")),
    "mobilevit_xs": ("transformer", _timm("mobilevit_xs")),
    "bert_base": ("transformer", _bert),
    "gpt2": ("transformer", _gpt2),
}
