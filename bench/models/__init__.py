"""The models the suites and probes build: one registry of plug-ins, each a factory.

A name maps to a :class:`ModelSpec`: its family (``cnn``, ``transformer``, ``decoder``,
``tiny``), the module and function that build it (imported only when built, as TorchBench's
model folders are), and the packages it needs beyond torch. A factory returns ``(model in eval
mode, example inputs at batch 1)``, random weights, nothing downloaded:

* :mod:`.resnet`: ResNet-50 in plain ``torch.nn`` (``resnet50_nn``: no torchvision);
* :mod:`.zoo`: torchvision, timm and transformers architectures (the ``[bench]`` extra);
* :mod:`.decoder`: the decoder LLM shapes (Qwen2.5-0.5B, a small GQA Llama);
* :mod:`.tiny`: models of seconds for smoke runs (a tiny CNN, an MLP).

The test suite's zoo (``tests/zoo``, hand-written ``torch.nn`` and tiny transformers configs)
is reachable as ``zoo:<name>`` (:func:`build`), so the coverage suite and the tests read the
same models. Importing this package imports no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["MODELS", "ModelSpec", "build", "family", "names"]


@dataclass(frozen=True)
class ModelSpec:
    """One model plug-in: its family, ``module:function`` factory and extra packages."""

    family: str
    factory: str
    needs: tuple[str, ...] = ()

    def build(self) -> tuple[Any, tuple[Any, ...]]:
        """``(model, example inputs)`` from the factory."""
        module, _, function = self.factory.partition(":")
        return getattr(importlib.import_module(module), function)()


def _zoo(function: str, family: str, *needs: str) -> ModelSpec:
    return ModelSpec(family, f"bench.models.zoo:{function}", needs)


MODELS: dict[str, ModelSpec] = {
    "resnet50": _zoo("resnet50", "cnn", "torchvision"),
    "mobilenet_v2": _zoo("mobilenet_v2", "cnn", "torchvision"),
    "mobilenet_v3_large": _zoo("mobilenet_v3_large", "cnn", "torchvision"),
    "efficientnet_b0": _zoo("efficientnet_b0", "cnn", "torchvision"),
    "convnext_tiny": _zoo("convnext_tiny", "cnn", "torchvision"),
    "regnet_y_400mf": _zoo("regnet_y_400mf", "cnn", "torchvision"),
    "ghostnet_100": _zoo("ghostnet_100", "cnn", "timm"),
    "densenet121": _zoo("densenet121", "cnn", "torchvision"),
    "vgg11_bn": _zoo("vgg11_bn", "cnn", "torchvision"),
    "vit_tiny": _zoo("vit_tiny", "transformer", "timm"),
    "vit_small": _zoo("vit_small", "transformer", "timm"),
    "deit_tiny": _zoo("deit_tiny", "transformer", "timm"),
    "mobilevit_xs": _zoo("mobilevit_xs", "transformer", "timm"),
    "bert_base": _zoo("bert_base", "transformer", "transformers"),
    "distilbert": _zoo("distilbert", "transformer", "transformers"),
    "gpt2": _zoo("gpt2", "transformer", "transformers"),
    "resnet50_nn": ModelSpec("cnn", "bench.models.resnet:example"),
    "qwen2_0_5b": ModelSpec(
        "decoder", "bench.models.decoder:qwen2_0_5b_example", ("transformers",)
    ),
    "llama_small": ModelSpec(
        "decoder", "bench.models.decoder:llama_small_example", ("transformers",)
    ),
    "tiny_cnn": ModelSpec("tiny", "bench.models.tiny:tiny_cnn"),
    "mlp": ModelSpec("tiny", "bench.models.tiny:mlp"),
}


def names(family: str | None = None) -> list[str]:
    """The registered names (of one family)."""
    return [n for n, spec in MODELS.items() if family is None or spec.family == family]


def family(name: str) -> str:
    """The family of ``name`` (``zoo`` for a test-zoo model)."""
    return "zoo" if name.startswith("zoo:") else _spec(name).family


def _spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(
            f"no model {name!r}; registered: {', '.join(MODELS)} (or zoo:<name> "
            "for a model of tests/zoo)"
        )
    return MODELS[name]


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """``(model in eval mode, example inputs)`` of a registered model or ``zoo:<name>``.

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
    """
    if name.startswith("zoo:"):
        from tests.zoo import ZOO

        if name[4:] not in ZOO:
            raise ValueError(f"tests/zoo has no model {name[4:]!r}; it has {', '.join(ZOO)}")
        return ZOO[name[4:]]()
    return _spec(name).build()
