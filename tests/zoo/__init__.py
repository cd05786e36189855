"""The project's zoo: real architectures with random weights, for the coverage gate and the slow
compile-equals-eager check (issue 50, section 6).

One registry, :data:`ZOO`: name -> a factory returning ``(model in eval mode, example inputs)``.
Nothing downloads anything and nothing needs torchvision or timm (they cannot be imported in
CI): the vision, dense-prediction and sequence models are hand-written ``torch.nn``
(:mod:`.vision`, :mod:`.dense`, :mod:`.modern`, :mod:`.sequence`), the transformers models
are built from their ``Config`` classes at tiny sizes (:mod:`.transformers_models`).

Every factory runs under its own seed, with the global RNG state restored afterwards, so a
model's weights and inputs are the same on every call and building one changes no other test's
randomness. BatchNorm statistics are randomised (fresh ones are identities, which hides what
folding them does). Sizes are small: each model traces in about a second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.models import randomize_batchnorm
from tests.zoo import dense, modern, sequence, transformers_models, vision

__all__ = ["FAMILIES", "ZOO", "Factory", "output_tensors"]

Factory = Callable[[], tuple[nn.Module, tuple[Any, ...]]]


def _seeded(build: Callable[[], tuple[nn.Module, tuple[Any, ...]]]) -> Factory:
    def factory() -> tuple[nn.Module, tuple[Any, ...]]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, inputs = build()
            randomize_batchnorm(model)
        return model.eval(), inputs

    factory.__doc__ = build.__doc__
    return factory


# family -> that module's models; the families are disjoint
FAMILIES: dict[str, dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]]] = {
    "vision": vision.MODELS,
    "dense": dense.MODELS,
    "modern": modern.MODELS,
    "sequence": sequence.MODELS,
    "transformers": transformers_models.MODELS,
}


def _registry() -> dict[str, Factory]:
    zoo: dict[str, Factory] = {}
    for family, models in FAMILIES.items():
        for name, build in models.items():
            if name in zoo:
                raise ValueError(f"zoo model {name!r} of {family!r} is already registered")
            zoo[name] = _seeded(build)
    return zoo


#: name -> factory of ``(model in eval mode, example inputs)``, random weights, no download
ZOO: dict[str, Factory] = _registry()


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a model's output, in order: a tensor, or nested tuples, lists and dicts
    of them (transformers' ``ModelOutput`` is a dict of its fields that are set)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for value in out for t in output_tensors(value)]
    return []
