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
``pip install -c constraints.txt -e ".[bench]"``. Unit tests never need them. Each factory
seeds torch's generator (0) first, so a model and its inputs are the same in every run; the
registry is :data:`bench.models.MODELS`.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "PositionalText",
    "bert_base",
    "convnext_tiny",
    "deit_tiny",
    "densenet121",
    "distilbert",
    "efficientnet_b0",
    "ghostnet_100",
    "gpt2",
    "hf_text",
    "import_model_libraries",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilevit_xs",
    "regnet_y_400mf",
    "resnet50",
    "settle_batch_norm",
    "vgg11_bn",
    "vit_small",
    "vit_tiny",
]

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


Built = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]


def _torchvision(name: str) -> Built:
    import_model_libraries()
    import torchvision

    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    return settle_batch_norm(getattr(torchvision.models, name)(weights=None), x), (x,)


def _timm(name: str) -> Built:
    import_model_libraries()
    import timm

    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    return settle_batch_norm(timm.create_model(name, pretrained=False), x), (x,)


def resnet50() -> Built:
    """torchvision's ResNet-50 at 224x224."""
    return _torchvision("resnet50")


def mobilenet_v2() -> Built:
    """torchvision's MobileNetV2 at 224x224."""
    return _torchvision("mobilenet_v2")


def mobilenet_v3_large() -> Built:
    """torchvision's MobileNetV3-Large at 224x224."""
    return _torchvision("mobilenet_v3_large")


def efficientnet_b0() -> Built:
    """torchvision's EfficientNet-B0 at 224x224."""
    return _torchvision("efficientnet_b0")


def convnext_tiny() -> Built:
    """torchvision's ConvNeXt-Tiny at 224x224."""
    return _torchvision("convnext_tiny")


def regnet_y_400mf() -> Built:
    """torchvision's RegNetY-400MF at 224x224."""
    return _torchvision("regnet_y_400mf")


def densenet121() -> Built:
    """torchvision's DenseNet-121 at 224x224."""
    return _torchvision("densenet121")


def vgg11_bn() -> Built:
    """torchvision's VGG-11 with BatchNorm at 224x224."""
    return _torchvision("vgg11_bn")


def ghostnet_100() -> Built:
    """timm's GhostNet 1.0 at 224x224."""
    return _timm("ghostnet_100")


def vit_tiny() -> Built:
    """timm's ViT-Tiny/16 at 224x224."""
    return _timm("vit_tiny_patch16_224")


def vit_small() -> Built:
    """timm's ViT-Small/16 at 224x224."""
    return _timm("vit_small_patch16_224")


def deit_tiny() -> Built:
    """timm's DeiT-Tiny/16 at 224x224."""
    return _timm("deit_tiny_patch16_224")


def mobilevit_xs() -> Built:
    """timm's MobileViT-XS at 256x256 (timm's default input)."""
    return _timm("mobilevit_xs")


def _hf(config_name: str, model_name: str, **config: object) -> torch.nn.Module:
    import_model_libraries()
    import transformers

    torch.manual_seed(0)
    settings = getattr(transformers, config_name)(**config)
    settings._attn_implementation = "sdpa"
    return getattr(transformers, model_name)(settings).eval()


def bert_base() -> Built:
    """BERT-base, sequence 128 of token ids (no attention mask)."""
    model = _hf("BertConfig", "BertModel")
    return model, (torch.randint(0, 30000, (1, 128)),)


def distilbert() -> Built:
    """DistilBERT, sequence 128 of token ids (no attention mask)."""
    model = _hf("DistilBertConfig", "DistilBertModel")
    return model, (torch.randint(0, 30000, (1, 128)),)


def gpt2() -> Built:
    """GPT-2 small without a cache, sequence 128 of token ids."""
    model = _hf("GPT2Config", "GPT2Model", use_cache=False)
    return model, (torch.randint(0, 50000, (1, 128)),)


class PositionalText(torch.nn.Module):
    """A Hugging Face text model called with positional ``input_ids, attention_mask``,
    returning its first output tensor (what every peer is given)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def hf_text(name: str, batch: int = 1) -> Built:
    """``bert_base``, ``distilbert`` or ``gpt2`` with token ids and an attention mask of ones
    at ``batch`` x 128 (the transformers suite's form of them)."""
    model = {"bert_base": bert_base, "distilbert": distilbert, "gpt2": gpt2}[name]()[0]
    ids = torch.randint(0, 20000, (batch, 128))
    return PositionalText(model).eval(), (ids, torch.ones(batch, 128, dtype=torch.long))
