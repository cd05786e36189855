"""Conversions that spell attention out in GEMMs and one SDPA, which TensorRT fuses and quantizes.

``decompose_transformer_encoder_layer``: PyTorch's inference fast path
``torch._transformer_encoder_layer_fwd`` (batch first) becomes, with
``sa(x) = transpose(mha(transpose(x))[0])`` and ``ff(x) = W2 act(W1 x + b1) + b2``::

    norm_first:  x = src + sa(ln1(src));  out = x + ff(ln2(x))
    otherwise:   x = ln1(src + sa(src));  out = ln2(x + ff(x))

``decompose_mha``: ``F.multi_head_attention_forward`` (sequence first, ``(L, N, E)``) becomes::

    q, k, v = x_q Wq^T + bq, x_k Wk^T + bk, x_v Wv^T + bv     (in_proj_weight = [Wq; Wk; Wv])
    out = merge_heads(SDPA(split_heads(q, k, v, H))) Wo^T + bo

with ``SDPA(q, k, v) = softmax(q k^T / sqrt(E / H)) v`` per head, exactly what the function
computes when no mask, bias_k/bias_v, zero attention or training dropout is involved.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.attention_forms import merge_heads, split_heads
from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import PATH_KEY, canonical_call, constant_value, copy_meta
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["ATTENTION_CONVERSION_PATTERNS", "DecomposeMHA", "DecomposeTransformerEncoderLayer"]


def _sub(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Builder:
    """Creates nodes before the match's anchor, each with a module path; remembers them."""

    def __init__(self, m: Match) -> None:
        self.m, self.graph, self.nodes = m, m.graph, []

    def _add(self, node: fx.Node, path: str) -> fx.Node:
        node.meta[PATH_KEY] = path
        self.nodes.append(node)
        return node

    def call(self, target, path: str, **kwargs) -> fx.Node:
        with self.graph.inserting_before(self.m.anchor):
            return self._add(canonical_call(self.graph, target, path, **kwargs), path)

    def function(self, target, path: str, *args) -> fx.Node:
        with self.graph.inserting_before(self.m.anchor):
            return self._add(self.graph.call_function(target, args), path)

    def method(self, name: str, path: str, *args) -> fx.Node:
        with self.graph.inserting_before(self.m.anchor):
            return self._add(self.graph.call_method(name, args), path)

    def finish(self) -> None:
        infer_meta(self.m.gm, self.nodes)


# ---------------------------------------------------------------------------------------------
# torch._transformer_encoder_layer_fwd
# ---------------------------------------------------------------------------------------------


class DecomposeTransformerEncoderLayer(Pattern):
    """The encoder layer's fast-path op becomes layer norms, attention, feed-forward and adds."""

    name = "decompose_transformer_encoder_layer"
    phase = "conversion"

    @staticmethod
    def target(src, qkv_w, qkv_b, proj_w, proj_b, n1_w, n1_b, n2_w, n2_b, w1, b1, w2, b2):
        out = torch._transformer_encoder_layer_fwd(
            src,
            8,
            2,
            qkv_w,
            qkv_b,
            proj_w,
            proj_b,
            False,
            False,
            1e-5,
            n1_w,
            n1_b,
            n2_w,
            n2_b,
            w1,
            b1,
            w2,
            b2,
        )
        return out, {"layer": out}

    def check(self, m: Match) -> MatchResult:
        if m.kwarg("layer", "mask") is not None:
            return m.fail("an attention mask is given (only unmasked layers are decomposed)")
        if not isinstance(m.kwarg("layer", "eps"), float):
            return m.fail("eps is not a Python float (a graph input: dynamic=True made it one)")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        layer, path = m["layer"].kwargs, m.path
        b = _Builder(m)
        embed_dim = layer["embed_dim"]

        def norm(x: fx.Node, index: int) -> fx.Node:
            return b.call(
                F.layer_norm,
                _sub(path, f"norm{index}"),
                input=x,
                normalized_shape=(embed_dim,),
                weight=layer[f"norm_weight_{index}"],
                bias=layer[f"norm_bias_{index}"],
                eps=layer["eps"],
            )

        def self_attention(x: fx.Node) -> fx.Node:
            attn_path = _sub(path, "self_attn")
            seq_first = b.method("transpose", attn_path, x, 1, 0)
            mha = b.call(
                F.multi_head_attention_forward,
                attn_path,
                query=seq_first,
                key=seq_first,
                value=seq_first,
                embed_dim_to_check=embed_dim,
                num_heads=layer["num_heads"],
                in_proj_weight=layer["qkv_weight"],
                in_proj_bias=layer["qkv_bias"],
                bias_k=None,
                bias_v=None,
                add_zero_attn=False,
                dropout_p=0.0,
                out_proj_weight=layer["proj_weight"],
                out_proj_bias=layer["proj_bias"],
                training=False,
                need_weights=False,
            )
            out = b.function(operator.getitem, attn_path, mha, 0)
            return b.method("transpose", attn_path, out, 1, 0)

        def feed_forward(x: fx.Node) -> fx.Node:
            hidden = b.call(
                F.linear,
                _sub(path, "linear1"),
                input=x,
                weight=layer["ffn_weight_1"],
                bias=layer["ffn_bias_1"],
            )
            if layer["use_gelu"]:
                hidden = b.call(F.gelu, path, input=hidden)
            else:
                hidden = b.call(torch.relu, path, input=hidden)
            return b.call(
                F.linear,
                _sub(path, "linear2"),
                input=hidden,
                weight=layer["ffn_weight_2"],
                bias=layer["ffn_bias_2"],
            )

        src = layer["src"]
        if layer["norm_first"]:
            x = b.call(torch.add, path, input=src, other=self_attention(norm(src, 1)))
            out = b.call(torch.add, path, input=x, other=feed_forward(norm(x, 2)))
        else:
            x = norm(b.call(torch.add, path, input=src, other=self_attention(src)), 1)
            out = norm(b.call(torch.add, path, input=x, other=feed_forward(x)), 2)
        b.finish()
        return out


# ---------------------------------------------------------------------------------------------
# F.multi_head_attention_forward
# ---------------------------------------------------------------------------------------------


class DecomposeMHA(Pattern):
    """``F.multi_head_attention_forward`` becomes Q/K/V linears, SDPA and the out-projection."""

    name = "decompose_mha"
    phase = "conversion"

    @staticmethod
    def target(query, key, value, in_w, in_b, out_w, out_b):
        mha = F.multi_head_attention_forward(
            query, key, value, 8, 2, in_w, in_b, None, None, False, 0.0, out_w, out_b
        )
        return mha, {"mha": mha}

    def check(self, m: Match) -> MatchResult:
        mha = m["mha"]
        kw = mha.kwargs
        for user in mha.users:
            if user.op != "call_function" or user.target is not operator.getitem:
                return m.fail(f"its result is used as a tuple by {user.name}")
            if user.args[1] == 1 and user.users:
                return m.fail("attention weights are used (need_weights with output 1 read)")
        if kw["attn_mask"] is not None or kw["is_causal"]:
            return m.fail("attn_mask is given (only unmasked attention is decomposed)")
        if kw["key_padding_mask"] is not None:
            return m.fail("key_padding_mask is given (only unmasked attention is decomposed)")
        if kw["bias_k"] is not None or kw["bias_v"] is not None:
            return m.fail("bias_k/bias_v are set (add_bias_kv=True)")
        if kw["add_zero_attn"]:
            return m.fail("add_zero_attn is set")
        if kw["static_k"] is not None or kw["static_v"] is not None:
            return m.fail("static_k/static_v are given")
        if kw["training"] and kw["dropout_p"] > 0:
            return m.fail("dropout is active (training=True, dropout_p > 0)")
        shape = m.shape("query")
        if shape is None:
            return m.fail("query shape is unknown (trace with example inputs)")
        if len(shape) != 3:
            return m.fail(f"query is not 3-d (unbatched attention, shape {tuple(shape)})")
        weights = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        names = weights if kw["use_separate_proj_weight"] else ("in_proj_weight",)
        for name in (*names, "in_proj_bias", "out_proj_weight", "out_proj_bias"):
            value = kw[name]
            if isinstance(value, fx.Node) and value.op != "get_attr":
                return m.fail(f"{name} is not a constant (freeze the parameters)")
        return m.ok()

    def _projections(self, m: Match) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        kw = m["mha"].kwargs

        def const(name: str) -> torch.Tensor | None:
            return constant_value(m.gm, kw[name]) if kw[name] is not None else None

        if kw["use_separate_proj_weight"]:
            weights = [const(n) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
        else:
            weights = list(const("in_proj_weight").chunk(3))
        bias = const("in_proj_bias")
        sizes = [w.shape[0] for w in weights]
        biases = list(bias.split(sizes)) if bias is not None else [None] * 3
        return list(zip(weights, biases))

    def replace(self, m: Match) -> fx.Node:
        anchor, path = m["mha"], m.path
        kw = anchor.kwargs
        b = _Builder(m)
        heads_in = []
        for name, (weight, bias) in zip(("q", "k", "v"), self._projections(m)):
            w = m.constant(weight, f"{name}_proj_weight")
            bb = m.constant(bias, f"{name}_proj_bias") if bias is not None else None
            heads_in.append(b.call(F.linear, path, input=kw[_INPUT[name]], weight=w, bias=bb))
        heads = b.function(split_heads, path, *heads_in, kw["num_heads"])
        q, k, v = (b.function(operator.getitem, path, heads, i) for i in range(3))
        attn = b.call(F.scaled_dot_product_attention, path, query=q, key=k, value=v)
        merged = b.function(merge_heads, path, attn)
        out = b.call(
            F.linear,
            _sub(path, "out_proj"),
            input=merged,
            weight=kw["out_proj_weight"],
            bias=kw["out_proj_bias"],
        )
        b.finish()
        # readers of getitem(mha, 0) read ``out``; the unread getitem(mha, 1) goes away
        for user in list(anchor.users):
            if user.args[1] == 0:
                copy_meta(user, out)  # the output's shape, even when symbolic
                out.meta[PATH_KEY] = _sub(path, "out_proj")
                user.replace_all_uses_with(out)
            m.graph.erase_node(user)
        return out


_INPUT = {"q": "query", "k": "key", "v": "value"}

ATTENTION_CONVERSION_PATTERNS = (DecomposeTransformerEncoderLayer(), DecomposeMHA())
