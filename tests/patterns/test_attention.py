"""Attention on the ``tensorrt`` target: canonical forms, decompositions and fusions."""

from __future__ import annotations

import operator

import expecttest
import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo import get_transformation_plan, transform
from embedl_dynamo.graph.canonicalize import canonicalize
from embedl_dynamo.graph.nodes import canonical_call
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.patterns.attention import (
    ATTENTION_FUSION_PATTERNS,
    FusedAttention,
    FusedLayerNorm,
    FusedQKVProjection,
    LayerNorm,
    MHAInProjection,
    ScaledDotProductAttention,
)
from embedl_dynamo.patterns.attention_decompose import (
    ATTENTION_CONVERSION_PATTERNS,
    DecomposeMHA,
    DecomposeTransformerEncoderLayer,
)
from embedl_dynamo.patterns.conversions import CONVERSION_PATTERNS
from embedl_dynamo.rewrite.qdq import Role
from embedl_dynamo.transform import trace
from tests.helpers import assert_same_outputs, dynamo_graph, max_abs_diff

G = torch.Generator().manual_seed(0)
CONVERSIONS = (*ATTENTION_CONVERSION_PATTERNS, *CONVERSION_PATTERNS)
ALL = (*CONVERSIONS, *ATTENTION_FUSION_PATTERNS)


class SelfAttention(nn.Module):
    def __init__(self, batch_first: bool = True, **kwargs) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=batch_first, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


class CrossAttention(nn.Module):
    def __init__(self, need_weights: bool = False, **kwargs) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True, **kwargs)
        self.need_weights = need_weights

    def forward(self, x: torch.Tensor, memory: torch.Tensor):
        out, weights = self.attn(x, memory, memory, need_weights=self.need_weights)
        return (out, weights) if self.need_weights else out


X = torch.randn(2, 5, 16, generator=G)
MEMORY = torch.randn(2, 7, 16, generator=G)


def _call_targets(gm: fx.GraphModule) -> list[str]:
    return [
        f"{n.op}:{getattr(n.target, '__name__', n.target)}"
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    ]


# ---------------------------------------------------------------------------------------------
# canonical forms
# ---------------------------------------------------------------------------------------------


class TestCanonicalForms(expecttest.TestCase):
    def test_multihead_attention_matches_dynamo(self) -> None:
        model = SelfAttention().eval()
        traced = canonicalize(trace(model, (X,)))
        dynamo = canonicalize(dynamo_graph(model, X))
        assert _call_targets(traced) == _call_targets(dynamo)
        self.assertExpectedInline(
            format_graph(traced),
            """\
input x
transpose = .transpose(x, 1, 0)
multi_head_attention_forward = multi_head_attention_forward(query=transpose, key=transpose, value=transpose, in_proj_weight=$attn.in_proj_weight, in_proj_bias=$attn.in_proj_bias, out_proj_weight=$attn.out_proj.weight, out_proj_bias=$attn.out_proj.bias)
getitem = getitem(multi_head_attention_forward, 0)
transpose_1 = .transpose(getitem, 1, 0)
contiguous = contiguous(input=transpose_1)
return contiguous""",
        )

    def test_transformer_encoder_matches_dynamo(self) -> None:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        traced = canonicalize(trace(model, (X,)))
        dynamo = canonicalize(dynamo_graph(model, X))
        assert _call_targets(traced) == _call_targets(dynamo)
        paths = [n.meta["embedl_path"] for n in traced.graph.nodes if n.op == "call_function"]
        assert paths == ["model.layers.0", "model.layers.1"]
        with torch.no_grad():
            assert max_abs_diff(model(X), traced(X)) <= 1e-5

    def test_encoder_layer_with_unsupported_activation_stays_a_module(self) -> None:
        layer = nn.TransformerEncoderLayer(16, 2, 32, activation=F.silu, batch_first=True).eval()
        traced = canonicalize(trace(layer, (X,)))
        assert [n.op for n in traced.graph.nodes] == ["placeholder", "call_module", "output"]


# ---------------------------------------------------------------------------------------------
# decompose_mha
# ---------------------------------------------------------------------------------------------


class TestDecomposeMHA(expecttest.TestCase):
    def test_match_becomes_linears_sdpa_and_out_projection(self) -> None:
        model = SelfAttention().eval()
        result = transform(model, (X,), CONVERSIONS)
        assert result.plan["decompose_mha@attn"].applied
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
transpose = .transpose(x, 1, 0)
linear = linear(input=transpose, weight=$_const_attn_q_proj_weight, bias=$_const_attn_q_proj_bias)
linear_1 = linear(input=transpose, weight=$_const_attn_k_proj_weight, bias=$_const_attn_k_proj_bias)
linear_2 = linear(input=transpose, weight=$_const_attn_v_proj_weight, bias=$_const_attn_v_proj_bias)
split_heads = split_heads(linear, linear_1, linear_2, 2)
getitem_1 = getitem(split_heads, 0)
getitem_2 = getitem(split_heads, 1)
getitem_3 = getitem(split_heads, 2)
scaled_dot_product_attention = scaled_dot_product_attention(query=getitem_1, key=getitem_2, value=getitem_3)
merge_heads = merge_heads(scaled_dot_product_attention)
linear_3 = linear(input=merge_heads, weight=$attn.out_proj.weight, bias=$attn.out_proj.bias)
transpose_1 = .transpose(linear_3, 1, 0)
contiguous = contiguous(input=transpose_1)
return contiguous""",
        )
        assert_same_outputs(model, result.model, X)

    def test_sequence_first_numerics(self) -> None:
        model = SelfAttention(batch_first=False).eval()
        x = X.transpose(0, 1).contiguous()
        result = transform(model, (x,), CONVERSIONS)
        assert result.plan["decompose_mha@attn"].applied
        assert_same_outputs(model, result.model, x)

    def test_no_match_when_attention_weights_are_used(self) -> None:
        model = CrossAttention(need_weights=True).eval()
        result = transform(model, (X, MEMORY), CONVERSIONS)
        entry = result.plan["decompose_mha@attn"]
        assert not entry.applied
        assert entry.reason == "attention weights are used (need_weights with output 1 read)"
        assert_same_outputs(model, result.model, X, MEMORY)

    def test_no_match_with_key_padding_mask(self) -> None:
        class Masked(CrossAttention):
            def forward(self, x, memory, mask):
                return self.attn(x, memory, memory, key_padding_mask=mask)[0]

        mask = torch.zeros(2, 7, dtype=torch.bool)
        plan = get_transformation_plan(Masked().eval(), [DecomposeMHA()], args=(X, MEMORY, mask))
        assert plan["decompose_mha@attn"].reason == (
            "key_padding_mask is given (only unmasked attention is decomposed)"
        )

    def test_no_match_with_dropout_in_training(self) -> None:
        model = CrossAttention(dropout=0.1).train()
        plan = get_transformation_plan(model, [DecomposeMHA()], args=(X, MEMORY))
        assert plan["decompose_mha@attn"].reason == (
            "dropout is active (training=True, dropout_p > 0)"
        )

    def test_no_match_for_unbatched_input(self) -> None:
        model = SelfAttention(batch_first=False).eval()
        plan = get_transformation_plan(model, [DecomposeMHA()], args=(X[0],))
        assert plan["decompose_mha@attn"].reason == (
            "query is not 3-d (unbatched attention, shape (5, 16))"
        )


# ---------------------------------------------------------------------------------------------
# decompose_transformer_encoder_layer
# ---------------------------------------------------------------------------------------------


class TestDecomposeEncoderLayer(expecttest.TestCase):
    def test_snapshot_post_norm(self) -> None:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
        result = transform(layer, (X,), [DecomposeTransformerEncoderLayer()])
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input src
transpose = .transpose(src, 1, 0)
multi_head_attention_forward = multi_head_attention_forward(query=transpose, key=transpose, value=transpose, in_proj_weight=$model.self_attn.in_proj_weight, in_proj_bias=$model.self_attn.in_proj_bias, out_proj_weight=$model.self_attn.out_proj.weight, out_proj_bias=$model.self_attn.out_proj.bias)
getitem = getitem(multi_head_attention_forward, 0)
transpose_1 = .transpose(getitem, 1, 0)
add = add(input=src, other=transpose_1)
layer_norm = layer_norm(input=add, weight=$model.norm1.weight, bias=$model.norm1.bias)
linear = linear(input=layer_norm, weight=$model.linear1.weight, bias=$model.linear1.bias)
relu = relu(input=linear)
linear_1 = linear(input=relu, weight=$model.linear2.weight, bias=$model.linear2.bias)
add_1 = add(input=layer_norm, other=linear_1)
layer_norm_1 = layer_norm(input=add_1, weight=$model.norm2.weight, bias=$model.norm2.bias)
return layer_norm_1""",
        )

    def test_no_match_with_mask(self) -> None:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
        graph = fx.Graph()
        src, mask = graph.placeholder("src"), graph.placeholder("mask")
        attr = {
            "qkv_weight": "self_attn.in_proj_weight",
            "qkv_bias": "self_attn.in_proj_bias",
            "proj_weight": "self_attn.out_proj.weight",
            "proj_bias": "self_attn.out_proj.bias",
            "norm_weight_1": "norm1.weight",
            "norm_bias_1": "norm1.bias",
            "norm_weight_2": "norm2.weight",
            "norm_bias_2": "norm2.bias",
            "ffn_weight_1": "linear1.weight",
            "ffn_bias_1": "linear1.bias",
            "ffn_weight_2": "linear2.weight",
            "ffn_bias_2": "linear2.bias",
        }
        node = canonical_call(
            graph,
            torch._transformer_encoder_layer_fwd,
            "layer",
            src=src,
            embed_dim=16,
            num_heads=2,
            use_gelu=False,
            norm_first=False,
            eps=1e-5,
            mask=mask,
            mask_type=0,
            **{k: graph.get_attr(v) for k, v in attr.items()},
        )
        graph.output(node)
        plan = get_transformation_plan(fx.GraphModule(layer, graph), CONVERSIONS)
        entry = plan["decompose_transformer_encoder_layer@layer"]
        assert not entry.applied
        assert entry.reason == "an attention mask is given (only unmasked layers are decomposed)"


# ---------------------------------------------------------------------------------------------
# fusions
# ---------------------------------------------------------------------------------------------


class TestFusions(expecttest.TestCase):
    def test_self_attention_fuses_into_projection_attention_and_out_linear(self) -> None:
        model = SelfAttention().eval()
        result = transform(model, (X,), ALL)
        plan = result.plan
        assert plan["mha_in_projection@attn"].apply
        assert plan["scaled_dot_product_attention@attn"].apply
        self.assertExpectedInline(
            format_graph(result.model),
            """\
input x
transpose = .transpose(x, 1, 0)
mha_in_projection_attn = FusedQKVProjection(transpose)
getitem_1 = getitem(mha_in_projection_attn, 0)
getitem_2 = getitem(mha_in_projection_attn, 1)
getitem_3 = getitem(mha_in_projection_attn, 2)
scaled_dot_product_attention_attn = FusedAttention(getitem_1, getitem_2, getitem_3)
merge_heads = merge_heads(scaled_dot_product_attention_attn)
linear_3 = linear(input=merge_heads, weight=$attn.out_proj.weight, bias=$attn.out_proj.bias)
transpose_1 = .transpose(linear_3, 1, 0)
contiguous = contiguous(input=transpose_1)
return contiguous""",
        )
        projection = next(m for m in result.model.modules() if isinstance(m, FusedQKVProjection))
        assert projection.weight.shape == (48, 16) and projection.sizes == [16, 16, 16]
        assert_same_outputs(model, result.model, X)

    def test_no_in_projection_fusion_for_cross_attention(self) -> None:
        model = CrossAttention().eval()
        result = transform(model, (X, MEMORY), ALL)
        entry = result.plan["mha_in_projection@attn"]
        assert not entry.apply
        assert entry.reason == "q, k and v projections read different inputs (cross-attention)"
        assert result.plan["scaled_dot_product_attention@attn"].apply
        assert_same_outputs(model, result.model, X, MEMORY)

    def test_layer_norm_fuses(self) -> None:
        model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16, eps=1e-6)).eval()
        result = transform(model, (X,), [LayerNorm()])
        entry = result.plan["layer_norm@1"]
        assert entry.apply and entry.reason == ""
        fused = [m for m in result.model.modules() if isinstance(m, FusedLayerNorm)]
        assert len(fused) == 1 and fused[0].eps == 1e-6
        assert_same_outputs(model, result.model, X)

    def test_no_layer_norm_fusion_with_weight_as_input(self) -> None:
        class Functional(nn.Module):
            def forward(self, x, w):
                return F.layer_norm(x, (16,), w)

        w = torch.rand(16, generator=G)
        plan = get_transformation_plan(Functional(), [LayerNorm()], args=(X, w))
        (entry,) = plan.entries
        assert entry.reason == "layer norm weight or bias is not a constant"

    def test_sdpa_fuses_and_keeps_causal_and_scale(self) -> None:
        class Attn(nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)

        q, k, v = (torch.randn(2, 2, 5, 8, generator=G) for _ in range(3))
        result = transform(Attn(), (q, k, v), [ScaledDotProductAttention()])
        (fused,) = [m for m in result.model.modules() if isinstance(m, FusedAttention)]
        assert (fused.is_causal, fused.scale) == (True, 0.3)
        assert_same_outputs(Attn(), result.model, q, k, v)

    def test_masked_sdpa_fuses_with_the_mask_as_fourth_input(self) -> None:
        class Masked(nn.Module):
            def forward(self, q, k, v, mask):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        q, k, v = (torch.randn(2, 2, 5, 8, generator=G) for _ in range(3))
        padding = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
        keep = padding[:, None, None, :]  # keys of the first sequence padded
        additive = (~keep).float() * torch.finfo(torch.float32).min
        for mask in (keep, additive):
            result = transform(Masked(), (q, k, v, mask), [ScaledDotProductAttention()])
            (fused,) = [n for n in result.model.graph.nodes if n.op == "call_module"]
            assert len(fused.args) == 4
            assert_same_outputs(Masked(), result.model, q, k, v, mask)

    def test_float_mask_follows_half_heads_without_overflow(self) -> None:
        q, k, v = (torch.randn(1, 2, 4, 8, generator=G).half() for _ in range(3))
        mask = torch.zeros(1, 1, 4, 4)
        mask[..., 2:] = torch.finfo(torch.float32).min  # -inf once cast to fp16 unclamped
        mask[:, :, 3] = torch.finfo(torch.float32).min  # one query row fully masked
        out = FusedAttention()(q, k, v, mask)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()  # -inf rows give NaN
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        rows = slice(0, 3)  # a fully masked row has no meaning; the others match float32
        torch.testing.assert_close(
            out.float()[..., rows, :], expected[..., rows, :], atol=2e-3, rtol=2e-3
        )

    def test_no_sdpa_fusion_with_dropout(self) -> None:
        class Dropped(nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

        q, k, v = (torch.randn(2, 2, 5, 8, generator=G) for _ in range(3))
        plan = get_transformation_plan(Dropped(), [ScaledDotProductAttention()], (q, k, v))
        (entry,) = plan.entries
        assert not entry.apply
        assert entry.reason == "dropout_p=0.1 (attention dropout is training only)"

    def test_qdq_declarations(self) -> None:
        assert FusedQKVProjection.qdq.inputs == {"0": Role.ACTIVATION}
        assert FusedQKVProjection.qdq.weights == {"weight": Role.WEIGHT}
        assert FusedAttention.qdq.inputs == {str(i): Role.ACTIVATION for i in range(3)}
        assert FusedLayerNorm.qdq.empty
        assert set(MHAInProjection.qdq.weights) == {"wq", "wk", "wv"}
        assert set(ScaledDotProductAttention.qdq.inputs) == {"q", "k", "v"}


@pytest.mark.parametrize(
    ("kwargs", "batch_first"),
    [({}, False), ({"kdim": 12, "vdim": 12}, True), ({"bias": False}, True)],
)
def test_multihead_attention_variants_stay_equal(kwargs, batch_first) -> None:
    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.attn = nn.MultiheadAttention(16, 2, batch_first=batch_first, **kwargs)

        def forward(self, x, memory):
            out, weights = self.attn(x, memory, memory)  # need_weights defaults to True
            return out, weights

    model = Cross().eval()
    width = kwargs.get("kdim", 16)
    memory = torch.randn(2, 7, width, generator=G)
    x = X
    if not batch_first:
        x, memory = (t.transpose(0, 1).contiguous() for t in (X, memory))
    traced = canonicalize(trace(model, (x, memory)))
    assert not any(n.op == "call_module" for n in traced.graph.nodes)
    with torch.no_grad():
        assert max_abs_diff(model(x, memory), traced(x, memory)) <= 1e-5


@pytest.mark.parametrize(
    "kwargs", [{}, {"kdim": 12, "vdim": 10}, {"bias": False}], ids=["packed", "kv", "nobias"]
)
def test_cross_attention_numerics(kwargs) -> None:
    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True, **kwargs)

        def forward(self, x, k, v):
            return self.attn(x, k, v)[0]  # need_weights=True, weights unused

    k = torch.randn(2, 7, kwargs.get("kdim", 16), generator=G)
    v = torch.randn(2, 7, kwargs.get("vdim", 16), generator=G)
    model = Cross().eval()
    result = transform(model, (X, k, v), CONVERSIONS)
    assert result.plan["decompose_mha@attn"].applied
    assert_same_outputs(model, result.model, X, k, v)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"add_bias_kv": True}, "bias_k/bias_v are set (add_bias_kv=True)"),
        ({"add_zero_attn": True}, "add_zero_attn is set"),
    ],
)
def test_no_match_for_unsupported_options(kwargs, reason) -> None:
    model = CrossAttention(**kwargs).eval()
    plan = get_transformation_plan(model, [DecomposeMHA()], args=(X, MEMORY))
    assert plan["decompose_mha@attn"].reason == reason


@pytest.mark.parametrize(
    ("norm_first", "activation"), [(False, "relu"), (True, "gelu"), (True, "relu")]
)
def test_encoder_layer_decomposition_numerics(norm_first: bool, activation: str) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        16, 2, 32, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    result = transform(layer, (X,), CONVERSIONS)
    assert result.plan["decompose_transformer_encoder_layer@model"].applied
    assert result.plan["decompose_mha@model.self_attn"].applied
    targets = {n.target for n in result.model.graph.nodes}
    assert torch._transformer_encoder_layer_fwd not in targets
    assert F.scaled_dot_product_attention in targets
    assert (F.gelu if activation == "gelu" else torch.relu) in targets
    assert_same_outputs(layer, result.model, X)


def test_split_and_merge_heads_are_inverse() -> None:
    from embedl_dynamo.graph.attention_forms import merge_heads, split_heads

    q = torch.randn(5, 2, 16, generator=G)
    heads = split_heads(q, q, q, 4)
    assert heads[0].shape == (2, 4, 5, 4)
    assert torch.equal(merge_heads(heads[0]), q)
    assert operator.getitem(heads, 1) is heads[1]


def _masks(n, h, length):
    keep = torch.rand(n, 1, length, length) > 0.3
    keep[..., 0] = True
    keep[:, :, 1] = False  # a query that attends nowhere: zeros, as in SDPA
    padding = torch.zeros(n, 1, 1, length)
    padding[..., -3:] = torch.finfo(torch.float32).min  # HF's additive padding mask
    return {
        "none": (None, False),
        "bool": (keep, False),
        "float": (padding, False),
        "causal": (None, True),
    }


@pytest.mark.parametrize("kind", ["none", "bool", "float", "causal"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_the_export_form_computes_what_sdpa_computes(kind, scale) -> None:
    from embedl_dynamo.patterns.attention_export import attention_for_export

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16) for _ in range(3))
    mask, causal = _masks(2, 4, 7)[kind]
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale
    )
    got = attention_for_export(q, k, v, mask, causal, scale)
    assert max_abs_diff(got, expected) <= 1e-5


def test_exported_attention_reads_q_and_k_in_its_matmul(tmp_path) -> None:
    """In the ONNX file the first MatMul reads q and k^T directly and the scale follows it, so
    a DequantizeLinear of q or k feeds the MatMul (what TensorRT needs to fuse INT8 q k^T)."""
    import onnx

    from embedl_dynamo.onnx.export import export_onnx
    from embedl_dynamo.patterns.attention import FusedAttention

    graph = fx.Graph()
    inputs = [graph.placeholder(name) for name in ("q", "k", "v")]
    graph.output(graph.call_module("attention", tuple(inputs)))  # as a fusion leaves it
    root = nn.Module()
    root.attention = FusedAttention()
    gm = fx.GraphModule(root, graph)
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    path = export_onnx(gm, [q, k, v], tmp_path / "attention.onnx", dynamic_batch=False)
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    first = next(n for n in graph.node if n.op_type == "MatMul")
    assert first.input[0] == "input_0"  # q, untouched
    assert producer[first.input[1]].op_type == "Transpose"
    assert producer[first.input[1]].input[0] == "input_1"  # k^T
    (after,) = [n for n in graph.node if first.output[0] in n.input]
    assert after.op_type == "Mul"


def test_attention_probs_take_a_float32_mask_in_half_precision_as_the_fused_module_does():
    from embedl_dynamo.patterns.attention import AttentionProbs, FusedAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8).half() for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., -1] = torch.finfo(torch.float32).min  # HF's "masked" in float32: -inf in fp16
    probs = AttentionProbs()(q, k, mask)
    assert probs.dtype == torch.float16 and torch.isfinite(probs).all()
    assert probs[..., -1].abs().max() == 0  # the masked key gets no weight
    fused = FusedAttention()(q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close((probs.float() @ v.float()), fused, rtol=1e-2, atol=1e-2)
