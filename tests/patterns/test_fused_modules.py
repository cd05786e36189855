"""``frozen_parameter`` (:mod:`embedl_dynamo.patterns.fused_modules`): a model's parameter is
copied, a frozen constant is shared."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.backend import as_backend
from embedl_dynamo.patterns.fused_modules import FusedLinear, frozen_parameter
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation


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


class _TiedHead(nn.Module):
    """An LLM's tied embedding: one table looked up and multiplied by (the output head)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, 16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.linear(F.embedding(ids, self.table), self.table)


def test_a_tied_table_a_fused_linear_reads_is_neither_copied_nor_cloned():
    """The fused head shares the frozen table, and sharing it does not make the plan copy the
    table as if the fused module might write it (nothing in a frozen graph's fusion does)."""
    torch.manual_seed(0)
    model = _TiedHead().eval()
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    frozen = fx.symbolic_trace(model)
    del frozen._parameters["table"]  # as a compile's freeze() has it: a plain constant
    frozen.register_buffer("table", model.table.detach())
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    result = apply_transformation_plan(plan_transformation(frozen, patterns, args=(ids,))).model
    heads = [m for m in result.modules() if isinstance(m, FusedLinear)]
    assert len(heads) == 1
    pointer = model.table.data_ptr()
    kept = [t for t in (*result.parameters(), *result.buffers()) if t.numel() == 50 * 16]
    assert kept and all(t.data_ptr() == pointer for t in kept)  # the user's table, once
    torch.testing.assert_close(result(ids), model(ids))
