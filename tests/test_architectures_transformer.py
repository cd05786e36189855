"""ViTLike and TransformerEncoderNet through the ``tensorrt`` patterns: symbolic_trace and Dynamo.

Both paths must give the same plan ids (module paths, not node names) and outputs equal to eager.
"""

from __future__ import annotations

import expecttest
import pytest
import torch
from torch import nn

from embedl_dynamo import apply_transformation_plan, get_transformation_plan, transform
from embedl_dynamo.backends.tensorrt import TENSORRT_PATTERNS
from embedl_dynamo.patterns.attention import FusedAttention, FusedQKVProjection
from tests.helpers import assert_same_outputs, dynamo_frozen, plan_table
from tests.models import TransformerEncoderNet, ViTLike

G = torch.Generator().manual_seed(0)
IMAGES = torch.randn(2, 3, 16, 16, generator=G)
TOKENS = torch.randn(2, 6, 16, generator=G)


def _ids(plan, applied: bool) -> list[str]:
    return sorted(e.id for e in plan.entries if (e.applied or e.apply) == applied)


def _fused_counts(model: nn.Module) -> tuple[int, int]:
    modules = list(model.modules())
    return (
        sum(isinstance(m, FusedQKVProjection) for m in modules),
        sum(isinstance(m, FusedAttention) for m in modules),
    )


class TestViTLike(expecttest.TestCase):
    def setUp(self) -> None:
        torch.manual_seed(0)
        self.model = ViTLike().eval()

    def test_symbolic_trace_path(self) -> None:
        result = transform(self.model, (IMAGES,), TENSORRT_PATTERNS)
        assert_same_outputs(self.model, result.model, IMAGES)
        assert _fused_counts(result.model) == (2, 2)
        self.assertExpectedInline(
            plan_table(result.plan),
            """\
id                                          pattern                       apply    reason
------------------------------------------  ----------------------------  -------  -------------------------------------------------
decompose_mha@blocks.0.attn                 decompose_mha                 applied
decompose_mha@blocks.1.attn                 decompose_mha                 applied
remove_dropout@blocks.0.mlp.2               remove_dropout                applied
remove_dropout@blocks.1.mlp.2               remove_dropout                applied
expand_grouped_kv@blocks.0.attn             expand_grouped_kv             no       not grouped-query attention (enable_gqa is False)
expand_grouped_kv@blocks.1.attn             expand_grouped_kv             no       not grouped-query attention (enable_gqa is False)
mha_in_projection@blocks.0.attn             mha_in_projection             yes
mha_in_projection@blocks.1.attn             mha_in_projection             yes
linear_gelu@blocks.0.mlp.0                  linear_gelu                   yes
linear_gelu@blocks.1.mlp.0                  linear_gelu                   yes
conv@patch_embed                            conv                          yes
linear@blocks.0.attn                        linear                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#2                      linear                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#3                      linear                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn.out_proj               linear                        yes
linear@blocks.0.mlp.0                       linear                        no       overlaps linear_gelu@blocks.0.mlp.0
linear@blocks.0.mlp.3                       linear                        yes
linear@blocks.1.attn                        linear                        no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#2                      linear                        no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#3                      linear                        no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn.out_proj               linear                        yes
linear@blocks.1.mlp.0                       linear                        no       overlaps linear_gelu@blocks.1.mlp.0
linear@blocks.1.mlp.3                       linear                        yes
linear@head                                 linear                        yes
scaled_dot_product_attention@blocks.0.attn  scaled_dot_product_attention  yes
scaled_dot_product_attention@blocks.1.attn  scaled_dot_product_attention  yes
layer_norm@blocks.0.norm1                   layer_norm                    yes
layer_norm@blocks.0.norm2                   layer_norm                    yes
layer_norm@blocks.1.norm1                   layer_norm                    yes
layer_norm@blocks.1.norm2                   layer_norm                    yes
layer_norm@norm                             layer_norm                    yes""",
        )

    def test_dynamo_path_matches_symbolic_trace(self) -> None:
        gm, _ = dynamo_frozen(self.model, IMAGES)
        plan = get_transformation_plan(gm, TENSORRT_PATTERNS)
        result = apply_transformation_plan(plan)
        assert_same_outputs(self.model, result.model, IMAGES)
        assert _fused_counts(result.model) == (2, 2)
        traced = get_transformation_plan(self.model, TENSORRT_PATTERNS, args=(IMAGES,))
        assert plan_table(plan) == plan_table(traced)  # same ids, decisions and reasons
        assert _ids(traced, True) == _ids(plan, True)
        assert _ids(traced, False) == _ids(plan, False)


class TestTransformerEncoderNet(expecttest.TestCase):
    def setUp(self) -> None:
        torch.manual_seed(0)
        self.model = TransformerEncoderNet().eval()

    def test_symbolic_trace_path(self) -> None:
        result = transform(self.model, (TOKENS,), TENSORRT_PATTERNS)
        assert_same_outputs(self.model, result.model, TOKENS)
        assert _fused_counts(result.model) == (2, 2)
        self.assertExpectedInline(
            plan_table(result.plan),
            """\
id                                                       pattern                              apply    reason
-------------------------------------------------------  -----------------------------------  -------  -----------------------------------------------------
decompose_transformer_encoder_layer@encoder.layers.0     decompose_transformer_encoder_layer  applied
decompose_transformer_encoder_layer@encoder.layers.1     decompose_transformer_encoder_layer  applied
decompose_mha@encoder.layers.0.self_attn                 decompose_mha                        applied
decompose_mha@encoder.layers.1.self_attn                 decompose_mha                        applied
expand_grouped_kv@encoder.layers.0.self_attn             expand_grouped_kv                    no       not grouped-query attention (enable_gqa is False)
expand_grouped_kv@encoder.layers.1.self_attn             expand_grouped_kv                    no       not grouped-query attention (enable_gqa is False)
mha_in_projection@encoder.layers.0.self_attn             mha_in_projection                    yes
mha_in_projection@encoder.layers.1.self_attn             mha_in_projection                    yes
linear_relu@encoder.layers.0.linear1                     linear_relu                          yes
linear_relu@encoder.layers.1.linear1                     linear_relu                          yes
linear@proj                                              linear                               yes
linear@encoder.layers.0.self_attn                        linear                               no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#2                      linear                               no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#3                      linear                               no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn.out_proj               linear                               yes
linear@encoder.layers.0.linear1                          linear                               no       overlaps linear_relu@encoder.layers.0.linear1
linear@encoder.layers.0.linear2                          linear                               yes
linear@encoder.layers.1.self_attn                        linear                               no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#2                      linear                               no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#3                      linear                               no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn.out_proj               linear                               yes
linear@encoder.layers.1.linear1                          linear                               no       overlaps linear_relu@encoder.layers.1.linear1
linear@encoder.layers.1.linear2                          linear                               yes
linear@head                                              linear                               yes
scaled_dot_product_attention@encoder.layers.0.self_attn  scaled_dot_product_attention         yes
scaled_dot_product_attention@encoder.layers.1.self_attn  scaled_dot_product_attention         yes
layer_norm@encoder.layers.0.norm1                        layer_norm                           yes
layer_norm@encoder.layers.0.norm2                        layer_norm                           yes
layer_norm@encoder.layers.1.norm1                        layer_norm                           yes
layer_norm@encoder.layers.1.norm2                        layer_norm                           yes""",
        )

    def test_dynamo_path_matches_symbolic_trace(self) -> None:
        gm, _ = dynamo_frozen(self.model, TOKENS)
        plan = get_transformation_plan(gm, TENSORRT_PATTERNS)
        result = apply_transformation_plan(plan)
        assert_same_outputs(self.model, result.model, TOKENS)
        assert _fused_counts(result.model) == (2, 2)
        traced = get_transformation_plan(self.model, TENSORRT_PATTERNS, args=(TOKENS,))
        assert plan_table(plan) == plan_table(traced)  # same ids, decisions and reasons
        assert _ids(traced, True) == _ids(plan, True)
        assert _ids(traced, False) == _ids(plan, False)


@pytest.mark.slow  # in CI's slow slice: the static transformers compile by default
def test_dynamic_batch_graphs_decompose_attention_or_say_why() -> None:
    """With ``dynamic=True`` the batch is symbolic; new nodes get fake-tensor shapes."""
    torch.manual_seed(0)
    plan = get_transformation_plan(
        dynamo_frozen(ViTLike().eval(), IMAGES, dynamic=True)[0], TENSORRT_PATTERNS
    )
    assert plan["decompose_mha@blocks.1.attn"].applied
    assert plan["mha_in_projection@blocks.1.attn"].apply
    # Dynamo makes the encoder layer's float ``eps`` a graph input; freezing holds it as the
    # constant it is (a call with another value runs the original graph), so it decomposes
    model = TransformerEncoderNet().eval()
    plan = get_transformation_plan(dynamo_frozen(model, TOKENS, dynamic=True)[0], TENSORRT_PATTERNS)
    assert plan["decompose_transformer_encoder_layer@encoder.layers.0"].applied
