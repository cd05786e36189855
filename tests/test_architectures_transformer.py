"""ViTLike and TransformerEncoderNet through the ``tensorrt`` patterns: symbolic_trace and Dynamo.

Both paths must give the same plan ids (module paths, not node names) and outputs equal to eager.
"""

from __future__ import annotations

import expecttest
import torch
from torch import fx, nn

from embedl_dynamo import apply_transformation_plan, get_transformation_plan, transform
from embedl_dynamo.backends.tensorrt import TENSORRT_PATTERNS
from embedl_dynamo.patterns.attention import FusedAttention, FusedQKVProjection
from tests.models import TransformerEncoderNet, ViTLike

G = torch.Generator().manual_seed(0)
IMAGES = torch.randn(2, 3, 16, 16, generator=G)
TOKENS = torch.randn(2, 6, 16, generator=G)


def dynamo_frozen(model: nn.Module, *args: torch.Tensor, dynamic: bool = False) -> fx.GraphModule:
    """Capture ``model`` with Dynamo (no grad) and freeze its parameters into ``get_attr``s."""
    captured: list[tuple[fx.GraphModule, list]] = []

    def backend(gm, inputs, **kwargs):
        captured.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=dynamic)(*args)
    assert len(captured) == 1, "expected one graph (no graph breaks)"
    gm, inputs = captured[0]
    graph = gm.graph
    for node, value in zip([n for n in graph.nodes if n.op == "placeholder"], inputs):
        if "_dynamo_static_input_type" not in node.meta.get("tensor_dict", {}):
            continue
        gm.register_buffer(node.name, value.detach().clone())
        with graph.inserting_before(node):
            const = graph.get_attr(node.name)
        const.meta.update(node.meta)
        node.replace_all_uses_with(const)
        graph.erase_node(node)
    gm.recompile()
    return gm


def _max_diff(model: nn.Module, transformed: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        expected, actual = model(x), transformed(x)
    if isinstance(actual, (tuple, list)):
        (actual,) = actual
    return (expected - actual).abs().max().item()


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
        assert _max_diff(self.model, result.model, IMAGES) <= 1e-5
        assert _fused_counts(result.model) == (2, 2)
        self.assertExpectedInline(
            str(result.plan),
            """\
id                                          pattern                       node                            apply    reason
------------------------------------------  ----------------------------  ------------------------------  -------  ----------------------------------------
decompose_mha@blocks.0.attn                 decompose_mha                 multi_head_attention_forward    applied
decompose_mha@blocks.1.attn                 decompose_mha                 multi_head_attention_forward_1  applied
remove_dropout@blocks.0.mlp.2               remove_dropout                dropout                         applied
remove_dropout@blocks.1.mlp.2               remove_dropout                dropout_1                       applied
remove_identity@blocks.0.attn               remove_identity               identity                        applied
remove_identity@blocks.1.attn               remove_identity               identity_1                      applied
mha_in_projection@blocks.0.attn             mha_in_projection             split_heads                     yes
mha_in_projection@blocks.1.attn             mha_in_projection             split_heads_1                   yes
linear_gelu@blocks.0.mlp.0                  linear_gelu                   gelu                            yes
linear_gelu@blocks.1.mlp.0                  linear_gelu                   gelu_1                          yes
conv@patch_embed                            conv                          conv2d                          yes
linear@blocks.0.attn                        linear                        linear_5                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#2                      linear                        linear_6                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#3                      linear                        linear_7                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn.out_proj               linear                        linear_8                        yes
linear@blocks.0.mlp.0                       linear                        linear                          no       overlaps linear_gelu@blocks.0.mlp.0
linear@blocks.0.mlp.3                       linear                        linear_1                        yes
linear@blocks.1.attn                        linear                        linear_9                        no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#2                      linear                        linear_10                       no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#3                      linear                        linear_11                       no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn.out_proj               linear                        linear_12                       yes
linear@blocks.1.mlp.0                       linear                        linear_2                        no       overlaps linear_gelu@blocks.1.mlp.0
linear@blocks.1.mlp.3                       linear                        linear_3                        yes
linear@head                                 linear                        linear_4                        yes
scaled_dot_product_attention@blocks.0.attn  scaled_dot_product_attention  scaled_dot_product_attention    yes
scaled_dot_product_attention@blocks.1.attn  scaled_dot_product_attention  scaled_dot_product_attention_1  yes
layer_norm@blocks.0.norm1                   layer_norm                    layer_norm                      yes
layer_norm@blocks.0.norm2                   layer_norm                    layer_norm_1                    yes
layer_norm@blocks.1.norm1                   layer_norm                    layer_norm_2                    yes
layer_norm@blocks.1.norm2                   layer_norm                    layer_norm_3                    yes
layer_norm@norm                             layer_norm                    layer_norm_4                    yes""",
        )

    def test_dynamo_path_matches_symbolic_trace(self) -> None:
        gm = dynamo_frozen(self.model, IMAGES)
        plan = get_transformation_plan(gm, TENSORRT_PATTERNS)
        self.assertExpectedInline(
            str(plan),
            """\
id                                          pattern                       node                            apply    reason
------------------------------------------  ----------------------------  ------------------------------  -------  ----------------------------------------
decompose_mha@blocks.0.attn                 decompose_mha                 multi_head_attention_forward_2  applied
decompose_mha@blocks.1.attn                 decompose_mha                 multi_head_attention_forward_3  applied
remove_dropout@blocks.0.mlp.2               remove_dropout                dropout                         applied
remove_dropout@blocks.1.mlp.2               remove_dropout                dropout_1                       applied
remove_identity@blocks.0.attn               remove_identity               identity                        applied
remove_identity@blocks.1.attn               remove_identity               identity_1                      applied
mha_in_projection@blocks.0.attn             mha_in_projection             split_heads                     yes
mha_in_projection@blocks.1.attn             mha_in_projection             split_heads_1                   yes
linear_gelu@blocks.0.mlp.0                  linear_gelu                   gelu                            yes
linear_gelu@blocks.1.mlp.0                  linear_gelu                   gelu_1                          yes
conv@patch_embed                            conv                          conv2d_1                        yes
linear@blocks.0.attn                        linear                        linear_9                        no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#2                      linear                        linear_10                       no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn#3                      linear                        linear_11                       no       overlaps mha_in_projection@blocks.0.attn
linear@blocks.0.attn.out_proj               linear                        linear_12                       yes
linear@blocks.0.mlp.0                       linear                        linear                          no       overlaps linear_gelu@blocks.0.mlp.0
linear@blocks.0.mlp.3                       linear                        linear_5                        yes
linear@blocks.1.attn                        linear                        linear_13                       no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#2                      linear                        linear_14                       no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn#3                      linear                        linear_15                       no       overlaps mha_in_projection@blocks.1.attn
linear@blocks.1.attn.out_proj               linear                        linear_16                       yes
linear@blocks.1.mlp.0                       linear                        linear_6                        no       overlaps linear_gelu@blocks.1.mlp.0
linear@blocks.1.mlp.3                       linear                        linear_7                        yes
linear@head                                 linear                        linear_8                        yes
scaled_dot_product_attention@blocks.0.attn  scaled_dot_product_attention  scaled_dot_product_attention    yes
scaled_dot_product_attention@blocks.1.attn  scaled_dot_product_attention  scaled_dot_product_attention_1  yes
layer_norm@blocks.0.norm1                   layer_norm                    layer_norm                      yes
layer_norm@blocks.0.norm2                   layer_norm                    layer_norm_4                    yes
layer_norm@blocks.1.norm1                   layer_norm                    layer_norm_5                    yes
layer_norm@blocks.1.norm2                   layer_norm                    layer_norm_6                    yes
layer_norm@norm                             layer_norm                    layer_norm_7                    yes""",
        )
        result = apply_transformation_plan(plan)
        assert _max_diff(self.model, result.model, IMAGES) <= 1e-5
        assert _fused_counts(result.model) == (2, 2)
        traced = get_transformation_plan(self.model, TENSORRT_PATTERNS, args=(IMAGES,))
        assert _ids(traced, True) == _ids(plan, True)
        assert _ids(traced, False) == _ids(plan, False)


class TestTransformerEncoderNet(expecttest.TestCase):
    def setUp(self) -> None:
        torch.manual_seed(0)
        self.model = TransformerEncoderNet().eval()

    def test_symbolic_trace_path(self) -> None:
        result = transform(self.model, (TOKENS,), TENSORRT_PATTERNS)
        assert _max_diff(self.model, result.model, TOKENS) <= 1e-5
        assert _fused_counts(result.model) == (2, 2)
        self.assertExpectedInline(
            str(result.plan),
            """\
id                                                       pattern                              node                              apply    reason
-------------------------------------------------------  -----------------------------------  --------------------------------  -------  -----------------------------------------------------
decompose_transformer_encoder_layer@encoder.layers.0     decompose_transformer_encoder_layer  _transformer_encoder_layer_fwd    applied
decompose_transformer_encoder_layer@encoder.layers.1     decompose_transformer_encoder_layer  _transformer_encoder_layer_fwd_1  applied
decompose_mha@encoder.layers.0.self_attn                 decompose_mha                        multi_head_attention_forward      applied
decompose_mha@encoder.layers.1.self_attn                 decompose_mha                        multi_head_attention_forward_1    applied
mha_in_projection@encoder.layers.0.self_attn             mha_in_projection                    split_heads                       yes
mha_in_projection@encoder.layers.1.self_attn             mha_in_projection                    split_heads_1                     yes
linear_relu@encoder.layers.0.linear1                     linear_relu                          relu                              yes
linear_relu@encoder.layers.1.linear1                     linear_relu                          relu_1                            yes
linear@proj                                              linear                               linear                            yes
linear@encoder.layers.0.self_attn                        linear                               linear_6                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#2                      linear                               linear_7                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#3                      linear                               linear_8                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn.out_proj               linear                               linear_9                          yes
linear@encoder.layers.0.linear1                          linear                               linear_2                          no       overlaps linear_relu@encoder.layers.0.linear1
linear@encoder.layers.0.linear2                          linear                               linear_3                          yes
linear@encoder.layers.1.self_attn                        linear                               linear_10                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#2                      linear                               linear_11                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#3                      linear                               linear_12                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn.out_proj               linear                               linear_13                         yes
linear@encoder.layers.1.linear1                          linear                               linear_4                          no       overlaps linear_relu@encoder.layers.1.linear1
linear@encoder.layers.1.linear2                          linear                               linear_5                          yes
linear@head                                              linear                               linear_1                          yes
scaled_dot_product_attention@encoder.layers.0.self_attn  scaled_dot_product_attention         scaled_dot_product_attention      yes
scaled_dot_product_attention@encoder.layers.1.self_attn  scaled_dot_product_attention         scaled_dot_product_attention_1    yes
layer_norm@encoder.layers.0.norm1                        layer_norm                           layer_norm                        yes
layer_norm@encoder.layers.0.norm2                        layer_norm                           layer_norm_1                      yes
layer_norm@encoder.layers.1.norm1                        layer_norm                           layer_norm_2                      yes
layer_norm@encoder.layers.1.norm2                        layer_norm                           layer_norm_3                      yes""",
        )

    def test_dynamo_path_matches_symbolic_trace(self) -> None:
        gm = dynamo_frozen(self.model, TOKENS)
        plan = get_transformation_plan(gm, TENSORRT_PATTERNS)
        self.assertExpectedInline(
            str(plan),
            """\
id                                                       pattern                              node                              apply    reason
-------------------------------------------------------  -----------------------------------  --------------------------------  -------  -----------------------------------------------------
decompose_transformer_encoder_layer@encoder.layers.0     decompose_transformer_encoder_layer  _transformer_encoder_layer_fwd    applied
decompose_transformer_encoder_layer@encoder.layers.1     decompose_transformer_encoder_layer  _transformer_encoder_layer_fwd_1  applied
decompose_mha@encoder.layers.0.self_attn                 decompose_mha                        multi_head_attention_forward      applied
decompose_mha@encoder.layers.1.self_attn                 decompose_mha                        multi_head_attention_forward_1    applied
mha_in_projection@encoder.layers.0.self_attn             mha_in_projection                    split_heads                       yes
mha_in_projection@encoder.layers.1.self_attn             mha_in_projection                    split_heads_1                     yes
linear_relu@encoder.layers.0.linear1                     linear_relu                          relu                              yes
linear_relu@encoder.layers.1.linear1                     linear_relu                          relu_1                            yes
linear@proj                                              linear                               linear                            yes
linear@encoder.layers.0.self_attn                        linear                               linear_7                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#2                      linear                               linear_8                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn#3                      linear                               linear_9                          no       overlaps mha_in_projection@encoder.layers.0.self_attn
linear@encoder.layers.0.self_attn.out_proj               linear                               linear_10                         yes
linear@encoder.layers.0.linear1                          linear                               linear_3                          no       overlaps linear_relu@encoder.layers.0.linear1
linear@encoder.layers.0.linear2                          linear                               linear_4                          yes
linear@encoder.layers.1.self_attn                        linear                               linear_11                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#2                      linear                               linear_12                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn#3                      linear                               linear_13                         no       overlaps mha_in_projection@encoder.layers.1.self_attn
linear@encoder.layers.1.self_attn.out_proj               linear                               linear_14                         yes
linear@encoder.layers.1.linear1                          linear                               linear_5                          no       overlaps linear_relu@encoder.layers.1.linear1
linear@encoder.layers.1.linear2                          linear                               linear_6                          yes
linear@head                                              linear                               linear_2                          yes
scaled_dot_product_attention@encoder.layers.0.self_attn  scaled_dot_product_attention         scaled_dot_product_attention      yes
scaled_dot_product_attention@encoder.layers.1.self_attn  scaled_dot_product_attention         scaled_dot_product_attention_1    yes
layer_norm@encoder.layers.0.norm1                        layer_norm                           layer_norm                        yes
layer_norm@encoder.layers.0.norm2                        layer_norm                           layer_norm_1                      yes
layer_norm@encoder.layers.1.norm1                        layer_norm                           layer_norm_2                      yes
layer_norm@encoder.layers.1.norm2                        layer_norm                           layer_norm_3                      yes""",
        )
        result = apply_transformation_plan(plan)
        assert _max_diff(self.model, result.model, TOKENS) <= 1e-5
        assert _fused_counts(result.model) == (2, 2)
        traced = get_transformation_plan(self.model, TENSORRT_PATTERNS, args=(TOKENS,))
        assert _ids(traced, True) == _ids(plan, True)
        assert _ids(traced, False) == _ids(plan, False)


def test_dynamic_batch_graphs_decompose_attention_or_say_why() -> None:
    """With ``dynamic=True`` the batch is symbolic; new nodes get fake-tensor shapes."""
    torch.manual_seed(0)
    plan = get_transformation_plan(dynamo_frozen(ViTLike().eval(), IMAGES, dynamic=True),
                                   TENSORRT_PATTERNS)  # fmt: skip
    assert plan["decompose_mha@blocks.1.attn"].applied
    assert plan["mha_in_projection@blocks.1.attn"].apply
    # Dynamo makes the encoder layer's float ``eps`` a graph input: declined, with the reason
    model = TransformerEncoderNet().eval()
    plan = get_transformation_plan(dynamo_frozen(model, TOKENS, dynamic=True), TENSORRT_PATTERNS)
    assert plan["decompose_transformer_encoder_layer@encoder.layers.0"].reason == (
        "eps is not a Python float (a graph input: dynamic=True made it one)"
    )
