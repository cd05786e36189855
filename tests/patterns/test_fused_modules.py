"""``frozen_parameter`` (:mod:`embedl_dynamo.patterns.fused_modules`): a model's parameter is
copied, a frozen constant is shared."""

from __future__ import annotations

import torch
from torch import nn

from embedl_dynamo.patterns.fused_modules import FusedLinear, frozen_parameter


def test_a_models_parameter_is_copied_so_training_the_fusion_leaves_it_alone():
    weight = nn.Parameter(torch.randn(4, 3))
    for source in (weight, weight.detach().requires_grad_(True)):
        kept = frozen_parameter(source)
        assert not kept.requires_grad
        assert kept.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
        torch.testing.assert_close(kept.detach(), source.detach(), rtol=0, atol=0)
        with torch.no_grad():
            kept.add_(1.0)
        assert not torch.equal(kept.detach(), source.detach())


def test_a_frozen_constant_is_shared_not_copied():
    """A compile's weights are plain tensors: the fused module reads them where they are."""
    constant = torch.randn(4, 3)
    kept = frozen_parameter(constant)
    assert not kept.requires_grad
    assert kept.untyped_storage().data_ptr() == constant.untyped_storage().data_ptr()
    assert frozen_parameter(None) is None
    linear = FusedLinear(constant, None)
    assert linear.weight.data_ptr() == constant.data_ptr()
    x = torch.randn(2, 3)
    torch.testing.assert_close(linear(x), x @ constant.T)
