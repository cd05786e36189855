"""The weight recipe: the ops a pipeline derives constants with, recorded and replayed on new
weights bit for bit; what a replay cannot repeat is tainted or a problem, never taken as a
constant no weight decides."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from embedl_dynamo.graph.weight_recipe import WeightRecipe
from embedl_dynamo.graph.weight_recorder import record_weights
from embedl_dynamo.graph.weight_tensors import same_bits
from embedl_dynamo.patterns.fused_modules import fold_batch_norm


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(8, 4, 3, 3, generator=g),
        "mean": torch.randn(8, generator=g),
        "var": torch.rand(8, generator=g) + 0.5,
        "gamma": torch.randn(8, generator=g),
        "beta": torch.randn(8, generator=g),
    }


def _fold(w: dict[str, torch.Tensor]) -> nn.Module:
    """What a conv-BN fusion and INT8's weight scales do to the weights."""
    weight, bias = fold_batch_norm(w["w"], None, w["mean"], w["var"], w["gamma"], w["beta"], 1e-5)
    module = nn.Module()
    module.weight = nn.Parameter(weight, requires_grad=False)
    module.register_buffer("bias", bias)
    module.register_buffer("scale", weight.abs().amax(dim=(1, 2, 3)) / 127)
    return copy.deepcopy(module)  # deep copies: parameters cloned, buffers by their storage


def test_a_replay_on_new_weights_gives_what_the_ops_give_bit_for_bit():
    old, new = _weights(0), _weights(1)
    with record_weights(old) as recorder:
        module = _fold(old)
    recipe = recorder.finish({"model": module})
    assert recipe.problem is None and set(recipe.outputs["model"]) == {"weight", "bias", "scale"}
    recipe = WeightRecipe.from_dict(json.loads(json.dumps(recipe.to_dict())))  # data only
    replayed = recipe.replay(new)["model"]
    expected = dict(_fold(new).named_parameters()) | dict(_fold(new).named_buffers())
    assert all(same_bits(replayed[k], expected[k].detach()) for k in expected)


def test_a_copy_written_into_afterwards_is_replayed_as_a_copy():
    """A clone whose source is written later stays a clone in the replay (a view would see
    the write)."""
    old, new = {"w": torch.randn(4)}, {"w": torch.randn(4)}
    with record_weights(old) as recorder:
        source = old["w"] * 2
        kept = source.clone()
        source.add_(1)
        module = nn.Module()
        module.register_buffer("kept", kept)
        module.register_buffer("source", source)
    replayed = recorder.finish({"m": module}).replay(new)["m"]
    assert torch.equal(replayed["kept"], new["w"] * 2)
    assert torch.equal(replayed["source"], new["w"] * 2 + 1)


def test_a_constant_mixed_with_an_activation_is_tainted_not_independent():
    """SmoothQuant's smoothed weight: the weights times factors from calibration data."""
    old = {"w": torch.randn(64, 64)}
    activation = torch.randn(128, 64)
    with record_weights(old) as recorder:
        factors = (activation @ old["w"]).abs().amax(0)  # depends on the weights and data
        module = nn.Module()
        module.register_buffer("smoothed", old["w"] * factors)
        module.register_buffer("scale", torch.tensor(0.5))
    recipe = recorder.finish({"m": module})
    assert "smoothed" in recipe.tainted("m")
    assert "scale" in recipe.independent["m"] and "scale" not in recipe.outputs["m"]


def test_a_weights_value_read_into_python_is_a_problem():
    old = {"w": torch.randn(4)}
    with record_weights(old) as recorder:
        module = nn.Module()
        module.register_buffer("b", old["w"] * float(old["w"].abs().max()))
    recipe = recorder.finish({"m": module})
    assert "read a weight's value" in recipe.problem
    with pytest.raises(ValueError, match="cannot be replayed"):
        recipe.replay(old)


def test_weights_of_another_shape_or_dtype_or_missing_are_named():
    old = _weights(0)
    with record_weights(old) as recorder:
        module = _fold(old)
    recipe = recorder.finish({"model": module})
    wrong = dict(old, w=torch.randn(8, 4, 1, 1))
    assert recipe.leaf_problem(wrong) == (
        "weight w is float32[8, 4, 1, 1], compiled as float32[8, 4, 3, 3]"
    )
    missing = {k: v for k, v in old.items() if k != "beta"}
    assert recipe.leaf_problem(missing) == "weight beta is missing"
    with pytest.raises(ValueError, match="weight mean is float64"):
        recipe.replay(dict(old, mean=old["mean"].double()))


def test_a_check_replay_that_differs_is_a_problem():
    """finish(check=True) replays the recipe on the recorded weights: a recipe that would not
    give the constants back is never kept as good."""
    old = {"w": torch.randn(4)}
    with record_weights(old) as recorder:
        module = nn.Module()
        module.register_buffer("noisy", old["w"] + torch.randn_like(old["w"]))  # random: no replay
    assert "replay gives another noisy" in recorder.finish({"m": module}).problem


def test_same_bits_compares_0d_tensors_by_their_bytes():
    """A 0-d weight (DeBERTa's scale, a learned temperature) has no last dim to view as bytes."""
    assert same_bits(torch.tensor(1.5), torch.tensor(1.5))
    assert not same_bits(torch.tensor(1.5), torch.tensor(-1.5))
    assert same_bits(torch.tensor(float("nan")), torch.tensor(float("nan")))
    assert not same_bits(torch.tensor(1.0), torch.tensor([1.0]))
