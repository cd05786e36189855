"""Canonical forms of the attention modules, so traced and Dynamo graphs look the same.

``torch.fx.symbolic_trace`` cannot trace ``nn.MultiheadAttention`` or ``nn.TransformerEncoder``
(data-dependent control flow), so the tracer keeps them as ``call_module`` leaves. Dynamo, on the
other hand, inlines them. The rewrites below expand a leaf into exactly the nodes Dynamo records
(torch 2.13, inference):

* ``nn.MultiheadAttention``: ``transpose(1, 0)`` of the inputs when ``batch_first``, then
  ``F.multi_head_attention_forward(...)`` (canonical, keyword-only), ``getitem`` 0 / 1 and, for
  the output, ``transpose(1, 0)`` and ``contiguous``, mirroring
  ``nn.MultiheadAttention.forward``'s slow path.
* ``nn.TransformerEncoderLayer``: one ``torch._transformer_encoder_layer_fwd(...)`` node (the
  inference fast path) when the layer qualifies for it (eval, ``batch_first``, relu/gelu, in-proj
  bias, same q/k/v width, equal norm eps, even heads, 3-d input, no masks); otherwise left as is.
* ``nn.TransformerEncoder``: its layers in sequence, then its final norm.

It also defines :func:`split_heads` and :func:`merge_heads`, the head reshapes the attention
decomposition emits; they are leaf functions (``torch.fx.wrap``), so a pattern can anchor on them.

:func:`bind_attention_scales` gives a ``scaled_dot_product_attention`` whose ``scale`` is a graph
value (``dynamic=True`` makes a float attribute a graph input, read with ``.item()``) a float
scale: ``sdpa(q, k, v, scale=s) == sdpa(q * s, k, v, scale=1.0)``, with ``s`` kept a tensor
input, so the exporter neither rejects the scale nor bakes in the value it was traced with.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph import canonical_ops
from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import PATH_KEY, canonical_call, node_shape

__all__ = ["ATTENTION_CANONICALIZERS", "bind_attention_scales", "merge_heads", "split_heads"]


def split_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(L, N, E)`` projections to ``(N, H, L, E / H)`` heads, the layout SDPA expects.

    Args:
        q, k, v: projected query, key and value, sequence first.
        num_heads: the number of heads ``H``.

    Returns:
        The three tensors split into heads.
    """
    return tuple(x.unflatten(-1, (num_heads, -1)).permute(1, 2, 0, 3) for x in (q, k, v))


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(N, H, L, D)`` attention output back to ``(L, N, H * D)``, sequence first."""
    return x.permute(2, 0, 1, 3).flatten(2)


def _get_attr(graph: fx.Graph, module: nn.Module, qualname: str, name: str) -> fx.Node | None:
    """A ``get_attr`` node for ``module``'s ``name`` (at ``qualname``), or None if it is None."""
    value = module
    for part in name.split("."):
        value = getattr(value, part, None)
    if value is None:
        return None
    return graph.get_attr(f"{qualname}.{name}" if qualname else name)


def _transpose(graph: fx.Graph, value: fx.Node, path: str) -> fx.Node:
    node = graph.call_method("transpose", (value, 1, 0))
    node.meta[PATH_KEY] = path
    return node


# ---------------------------------------------------------------------------------------------
# nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------


def _getitem_users(node: fx.Node) -> list[fx.Node] | None:
    """The ``getitem(node, 0 | 1)`` users of ``node``, or None if it is used any other way."""
    users = list(node.users)
    for user in users:
        if not (
            user.op == "call_function"
            and user.target is operator.getitem
            and len(user.args) == 2
            and user.args[1] in (0, 1)
        ):
            return None
    return users


def _to_sequence_first(
    graph: fx.Graph,
    qkv: tuple[fx.Node, fx.Node, fx.Node],
    path: str,
    created: list[fx.Node],
) -> tuple[fx.Node, fx.Node, fx.Node]:
    """Transpose batch-first query, key and value to sequence first, once per distinct node
    (self-attention passes one tensor three times; ``forward`` keeps that identity)."""
    query, key, value = qkv
    if key is value:
        if query is key:
            query = key = value = _transpose(graph, query, path)
            created.append(query)
        else:
            query, key = (_transpose(graph, x, path) for x in (query, key))
            value = key
            created += [query, key]
    else:
        query, key, value = (_transpose(graph, x, path) for x in (query, key, value))
        created += [query, key, value]
    return query, key, value


def _redirect_users(
    gm: fx.GraphModule,
    node: fx.Node,
    mha: fx.Node,
    users: list[fx.Node],
    created: list[fx.Node],
    path: str,
    transpose: bool,
) -> None:
    """Point ``node``'s ``getitem`` users at ``mha``; the output (item 0) of a batch-first
    module is transposed back to batch first after its getitem."""
    outputs = [u for u in users if u.args[1] == 0]
    for user in users:
        for key_ in ("val", "example_value", "tensor_meta"):
            user.meta.pop(key_, None)
        user.meta[PATH_KEY] = path
    user_nodes = []
    for user in outputs:
        user_nodes.append(user)
        if not transpose:
            continue
        with user.graph.inserting_after(user):
            back = _transpose(user.graph, user, path)
        with user.graph.inserting_after(back):
            contiguous = canonical_call(user.graph, canonical_ops.contiguous, path, input=back)
        user.replace_all_uses_with(contiguous, delete_user_cb=lambda n, back=back: n is not back)
        user_nodes += [back, contiguous]
    infer_meta(gm, created)
    node.replace_all_uses_with(mha)
    infer_meta(gm, [u for u in users if u not in outputs] + user_nodes)


def _multihead_attention(
    gm: fx.GraphModule, graph: fx.Graph, node: fx.Node, module: nn.MultiheadAttention
) -> fx.Node | None:
    """Expand an ``nn.MultiheadAttention`` call as its ``forward`` does (slow path)."""
    users = _getitem_users(node)
    if users is None:
        return None
    try:
        bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    call = bound.arguments
    query, key, value = call["query"], call["key"], call["value"]
    path = str(node.target)
    shape = node_shape(query)
    if module.batch_first and shape is None:
        return None  # batched or not decides the transposes: needs shape metadata
    batched = shape is not None and len(shape) == 3
    transpose = module.batch_first and batched

    created: list[fx.Node] = []
    if transpose:
        query, key, value = _to_sequence_first(graph, (query, key, value), path, created)

    def param(name: str) -> fx.Node | None:
        return _get_attr(graph, module, path, name)

    separate = not module._qkv_same_embed_dim
    mha = canonical_call(
        graph,
        F.multi_head_attention_forward,
        path,
        query=query,
        key=key,
        value=value,
        embed_dim_to_check=module.embed_dim,
        num_heads=module.num_heads,
        in_proj_weight=param("in_proj_weight"),
        in_proj_bias=param("in_proj_bias"),
        bias_k=param("bias_k"),
        bias_v=param("bias_v"),
        add_zero_attn=module.add_zero_attn,
        dropout_p=module.dropout,
        out_proj_weight=param("out_proj.weight"),
        out_proj_bias=param("out_proj.bias"),
        training=module.training,
        key_padding_mask=call["key_padding_mask"],
        need_weights=call["need_weights"],
        attn_mask=call["attn_mask"],
        use_separate_proj_weight=separate,
        q_proj_weight=param("q_proj_weight") if separate else None,
        k_proj_weight=param("k_proj_weight") if separate else None,
        v_proj_weight=param("v_proj_weight") if separate else None,
        average_attn_weights=call["average_attn_weights"],
        is_causal=call["is_causal"],
    )
    created.append(mha)
    _redirect_users(gm, node, mha, users, created, path, transpose)
    return mha


# ---------------------------------------------------------------------------------------------
# nn.TransformerEncoderLayer / nn.TransformerEncoder
# ---------------------------------------------------------------------------------------------


def fast_path_blocker(layer: nn.TransformerEncoderLayer, shape: tuple | None) -> str:
    """Why ``layer`` would not take PyTorch's inference fast path (empty if it would)."""
    attn = layer.self_attn
    if shape is None or len(shape) != 3:
        return "input is not a known 3-d (batched) shape"
    if layer.training:
        return "training is enabled"
    if not attn.batch_first:
        return "batch_first is False"
    if attn.in_proj_bias is None:
        return "self_attn has no bias"
    if not attn._qkv_same_embed_dim:
        return "q, k, v widths differ"
    if not getattr(layer, "activation_relu_or_gelu", 0):
        return "activation is not relu or gelu"
    if layer.norm1.eps != layer.norm2.eps:
        return "norm1.eps differs from norm2.eps"
    if attn.num_heads % 2 == 1:
        return "num_heads is odd"
    return ""


def _encoder_layer_node(
    graph: fx.Graph, layer: nn.TransformerEncoderLayer, path: str, src: fx.Node
) -> fx.Node:
    def param(name: str) -> fx.Node | None:
        return _get_attr(graph, layer, path, name)

    return canonical_call(
        graph,
        torch._transformer_encoder_layer_fwd,
        path,
        src=src,
        embed_dim=layer.self_attn.embed_dim,
        num_heads=layer.self_attn.num_heads,
        qkv_weight=param("self_attn.in_proj_weight"),
        qkv_bias=param("self_attn.in_proj_bias"),
        proj_weight=param("self_attn.out_proj.weight"),
        proj_bias=param("self_attn.out_proj.bias"),
        use_gelu=layer.activation_relu_or_gelu == 2,
        norm_first=layer.norm_first,
        eps=layer.norm1.eps,
        norm_weight_1=param("norm1.weight"),
        norm_bias_1=param("norm1.bias"),
        norm_weight_2=param("norm2.weight"),
        norm_bias_2=param("norm2.bias"),
        ffn_weight_1=param("linear1.weight"),
        ffn_bias_1=param("linear1.bias"),
        ffn_weight_2=param("linear2.weight"),
        ffn_bias_2=param("linear2.bias"),
        mask=None,
        mask_type=None,
    )


def _masks_given(node: fx.Node, names: tuple[str, ...]) -> bool:
    """Whether the call passes any mask (positionally after the input, or by keyword)."""
    if any(a is not None for a in node.args[1:]):
        return True
    return any(node.kwargs.get(name) not in (None, False) for name in names)


_LAYER_MASKS = ("src_mask", "src_key_padding_mask", "is_causal")
_ENCODER_MASKS = ("mask", "src_key_padding_mask", "is_causal")


def _transformer_encoder_layer(
    gm: fx.GraphModule, graph: fx.Graph, node: fx.Node, module: nn.TransformerEncoderLayer
) -> fx.Node | None:
    """The fast-path node for an eligible layer, else None (the module stays a leaf)."""
    if _masks_given(node, _LAYER_MASKS) or fast_path_blocker(module, node_shape(node.args[0])):
        return None
    new = _encoder_layer_node(graph, module, str(node.target), node.args[0])
    infer_meta(gm, [new])
    return new


def _transformer_encoder(
    gm: fx.GraphModule, graph: fx.Graph, node: fx.Node, module: nn.TransformerEncoder
) -> fx.Node | None:
    """The encoder's layers in sequence (fast-path nodes where eligible), then its norm."""
    if _masks_given(node, _ENCODER_MASKS):
        return None
    path = str(node.target)
    x = node.args[0]
    for index, layer in enumerate(module.layers):
        layer_path = f"{path}.layers.{index}"
        if isinstance(layer, nn.TransformerEncoderLayer) and not fast_path_blocker(
            layer, node_shape(x)
        ):
            x = _encoder_layer_node(graph, layer, layer_path, x)
        else:
            x = graph.call_module(layer_path, (x,))
            x.meta[PATH_KEY] = layer_path
        infer_meta(gm, [x])
    if module.norm is not None:
        if not isinstance(module.norm, nn.LayerNorm):
            x = graph.call_module(f"{path}.norm", (x,))
        else:
            x = canonical_call(
                graph,
                F.layer_norm,
                f"{path}.norm",
                input=x,
                normalized_shape=tuple(module.norm.normalized_shape),
                weight=_get_attr(graph, module, path, "norm.weight"),
                bias=_get_attr(graph, module, path, "norm.bias"),
                eps=module.norm.eps,
            )
        x.meta[PATH_KEY] = f"{path}.norm"
        infer_meta(gm, [x])
    return x


# module type -> rewrite(gm, graph, node, module) -> canonical node or None (leave as is).
ATTENTION_CANONICALIZERS: dict[type[nn.Module], Callable[..., fx.Node | None]] = {
    nn.MultiheadAttention: _multihead_attention,
    nn.TransformerEncoderLayer: _transformer_encoder_layer,
    nn.TransformerEncoder: _transformer_encoder,
}


# ---------------------------------------------------------------------------------------------
# scaled_dot_product_attention with a graph-valued scale
# ---------------------------------------------------------------------------------------------


def _scale_tensor(scale: fx.Node) -> fx.Node:
    """The tensor a ``scale.item()`` reads (Dynamo's unspecialised float), else ``scale``."""
    if scale.op == "call_method" and scale.target == "item" and len(scale.args) == 1:
        return scale.args[0]
    return scale


def bind_attention_scales(gm: fx.GraphModule) -> fx.GraphModule:
    """Move a graph-valued SDPA ``scale`` onto the query: ``sdpa(q * s, k, v, scale=1.0)``.

    Under ``torch.compile(dynamic=True)`` Dynamo turns a float attribute (HF's
    ``self.scaling``) into a graph input read with ``.item()``; a SymFloat scale reaches
    neither a fused attention module (its scale is a Python float) nor the ONNX exporter, which
    would bake the traced value in. Multiplying q by the scale tensor is the same math and keeps
    the scale a runtime input, so a changed attribute still gives PyTorch's answer.

    Args:
        gm: a canonical graph (SDPA as keyword-only ``F.scaled_dot_product_attention`` calls).

    Returns:
        ``gm``, changed in place.
    """
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        scale = node.kwargs.get("scale")
        if not isinstance(scale, fx.Node):
            continue
        path = node.meta.get(PATH_KEY, "")
        with graph.inserting_before(node):
            query = canonical_call(
                graph, torch.mul, path, input=node.kwargs["query"], other=_scale_tensor(scale)
            )
        infer_meta(gm, [query])
        node.update_kwarg("query", query)
        node.update_kwarg("scale", 1.0)
        if not scale.users:
            graph.erase_node(scale)
    return gm
