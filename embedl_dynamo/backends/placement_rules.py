"""The built-in targets' QDQ placement rules (phase ``quantized``): where each wants Q/DQ.

A :class:`~embedl_dynamo.quant.rules.PlacementRule` rewrites nothing: it *annotates*. Its ``qdq``
says which match names are quantized on the way in (activations), which constant inputs are
weights (per-channel), and whether the output is quantized; ``check`` says when an op stays in
float, and why (the reason lands in the quantization report). ``module_types`` extends a rule to
fused modules (:class:`~embedl_dynamo.patterns.fused_modules.FusedConv`), whose own ``qdq`` names
their inputs and weights; ``check_module`` applies the same policy to them. A variant (ONNX
Runtime's output Q/DQ) is an instance with other arguments, not a subclass.

Two placements, measured on ONNX Runtime's CPU provider (ResNet-50: 53 QLinearConv, 16
QLinearAdd with the onnxruntime placement; none with TensorRT's):

* **tensorrt**: QDQ on the inputs of Conv/Linear/MatMul; a conv's residual Add quantizes its
  skip input only (the conv branch stays inside the fused group, so TensorRT fuses the Add into
  the conv), an unfused residual Add both inputs; grouped convs whose channels are not multiples of
  4 and attention with head size outside {16, 32, 64} stay in float.
* **onnxruntime**: additionally Q/DQ on each conv's (post-activation) output and on each Add's
  output, so ORT's QDQ transformer forms QLinearConv and QLinearAdd.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.nodes import PATH_KEY, canonical_call, module_path, node_shape
from embedl_dynamo.patterns.attention import FusedAttention, FusedLayerNorm
from embedl_dynamo.patterns.fused_modules import (
    ACTIVATIONS,
    FusedConv,
    FusedConvAdd,
    FusedConvMaxPool,
    FusedLinear,
)
from embedl_dynamo.quant.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = [
    "ONNXRUNTIME_QUANTIZED_PATTERNS",
    "ORT_INTEGER_ACTIVATIONS",
    "TENSORRT_ATTENTION_HEAD_SIZES",
    "TENSORRT_QUANTIZED_PATTERNS",
    "WeightedOpRule",
    "QuantAttention",
    "QuantConv",
    "QuantFusedAttention",
    "QuantFusedModule",
    "QuantLinear",
    "QuantMatMul",
    "QuantResidualAdd",
    "QuantSDPA",
    "SplitFusedForORT",
]

TENSORRT_ATTENTION_HEAD_SIZES = (16, 32, 64)


def _grouped_conv_reason(weight: torch.Tensor | None, groups: int) -> str:
    if weight is None or groups == 1:
        return ""
    out_ch, in_per_group = weight.shape[0], weight.shape[1]
    if in_per_group % 4 or (out_ch // groups) % 4:
        return (
            f"grouped conv (groups={groups}) with {in_per_group} input / {out_ch // groups} output "
            "channels per group, not multiples of 4: INT8 does not pay"
        )
    return ""


class WeightedOpRule(PlacementRule):
    """Q/DQ on an op's input ``x`` and its constant weight ``w`` (per output channel), and on
    its output when ``output`` is a role (ONNX Runtime's placement).

    Args:
        name: the rule name.
        output: the role of the output's Q/DQ, or None.
    """

    def __init__(self, name: str, output: Role | None = None) -> None:
        self.name = name
        self.output = output
        self.qdq = QDQ(inputs={"x": Role.ACTIVATION}, weights={"w": Role.WEIGHT}, output=output)
        self.module_output = output


class QuantConv(WeightedOpRule):
    """Quantize a convolution's input and its weight (per output channel) [and its output].

    Args:
        name: the rule name.
        output: the role of the output's Q/DQ (ONNX Runtime wants it after the activation, to
            form QLinearConv), or None (TensorRT).
    """

    module_types = (FusedConv,)

    @staticmethod
    def target(x, w, b):
        conv = F.conv2d(x, w, b)
        return conv, {"conv": conv}

    def check(self, m: Match) -> MatchResult:
        if not m.is_constant("w"):
            return m.fail("convolution weight is not a constant")
        reason = _grouped_conv_reason(m.value("w"), m.kwarg("conv", "groups"))
        return m.fail(reason) if reason else m.ok()

    def check_module(self, module: FusedModule, node: fx.Node) -> str:
        return _grouped_conv_reason(module.weight, module.groups)


class QuantLinear(WeightedOpRule):
    """Quantize a Linear's input and its weight (per output feature) [and its output].

    Args:
        name: the rule name.
        output: the role of the output's Q/DQ (ONNX Runtime: QGemm / QLinearMatMul), or None.
    """

    module_types = (FusedLinear,)

    @staticmethod
    def target(x, w, b):
        out = F.linear(x, w, b)
        return out, {"linear": out}

    def check(self, m: Match) -> MatchResult:
        if not m.is_constant("w"):
            return m.fail("linear weight is not a constant")
        return m.ok()


class QuantMatMul(PlacementRule):
    """Quantize both inputs of a MatMul of two activations."""

    name = "quant_matmul"
    qdq = QDQ(inputs={"a": Role.ACTIVATION, "b": Role.ACTIVATION})

    @staticmethod
    def target(a, b):
        out = torch.matmul(a, b)
        return out, {"matmul": out}


def _is_embedding(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is F.embedding


def _is_residual(m: Match, a: str, b: str) -> str:
    sa, sb = m.shape(a), m.shape(b)
    if not (isinstance(m[a], fx.Node) and isinstance(m[b], fx.Node)):
        return "an input is a Python scalar, not a residual branch"
    if m.is_constant(a) or m.is_constant(b):
        return "an input is a constant (a bias add, not a residual)"
    if any(_is_embedding(m[name]) for name in (a, b)):
        # BERT's word + token type + position embeddings; OpenVINO 2026.4 also fails to compile
        # Q/DQ on the position embedding (a constant lookup) in its AddTransformation
        return "an input is an embedding lookup (an embedding sum, not a residual)"
    if sa is not None and sb is not None and tuple(sa) != tuple(sb):
        return f"input shapes {tuple(sa)} and {tuple(sb)} differ (broadcast add, not a residual)"
    return ""


def _is_layer_norm(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target is F.layer_norm
    if node.op == "call_module" and node.graph.owning_module is not None:
        return isinstance(node.graph.owning_module.get_submodule(str(node.target)), FusedLayerNorm)
    return False


def _feeds_layer_norm(node: fx.Node) -> bool:
    return any(_is_layer_norm(user) for user in node.users)


def _is_stream(node: Any) -> bool:
    """Whether ``node`` is a transformer's residual stream: a LayerNorm's output (post-norm,
    BERT) or a value a LayerNorm reads (pre-norm, ViT and GPT-2)."""
    return isinstance(node, fx.Node) and (_is_layer_norm(node) or _feeds_layer_norm(node))


class QuantResidualAdd(PlacementRule):
    """Quantize both branches of a residual Add [and its output].

    TensorRT fuses an Add whose inputs both carry Q/DQ into the convolution; ONNX Runtime forms
    QLinearAdd when the output is quantized too.

    A transformer's residual add (one read by a LayerNorm) is different: its stream input is
    the sum of every block so far, and rounding it to 8 bits per tensor at every block compounds
    (ViT-small on ONNX Runtime: cosine 0.91 to float). With ``float_stream`` such an add is
    left float (ONNX Runtime: no QLinearAdd, which would round the sum too; NNCF leaves these
    adds float as well). With ``branch_only`` only its other input, the block's output, is
    quantized (TensorRT: what NVIDIA ModelOpt places, so the GEMM before it can run INT8 out).

    Args:
        name: the rule name.
        output: the role of the output's Q/DQ, or None.
        float_stream: leave a transformer's residual add float.
        branch_only: quantize only the branch input of a transformer's residual add.
    """

    def __init__(
        self,
        name: str,
        output: Role | None = None,
        float_stream: bool = False,
        branch_only: bool = False,
    ) -> None:
        self.name = name
        self.output = output
        self.float_stream = float_stream
        self.branch_only = branch_only
        self.qdq = QDQ(inputs={"a": Role.ACTIVATION, "b": Role.ACTIVATION}, output=output)

    @staticmethod
    def target(a, b):
        out = torch.add(a, b)
        return out, {"add": out}

    def check(self, m: Match) -> MatchResult:
        if m.kwarg("add", "alpha") != 1:
            return m.fail("add with alpha != 1")
        reason = _is_residual(m, "a", "b")
        if not reason and self.float_stream and _feeds_layer_norm(m["add"]):
            reason = "a transformer's residual stream (read by a LayerNorm) stays float"
        return m.fail(reason) if reason else m.ok()

    def qdq_for(self, m: Match) -> QDQ:
        """Both inputs; with ``branch_only``, a transformer residual add's branch input only."""
        if not (self.branch_only and _feeds_layer_norm(m["add"])):
            return self.qdq
        stream = [name for name in ("a", "b") if _is_stream(m[name])]
        if len(stream) != 1:
            return self.qdq  # not a stream and a branch: keep both
        branch = "b" if stream == ["a"] else "a"
        return QDQ(inputs={branch: Role.ACTIVATION}, output=self.output)


def _head_size_reason(head_dim: Any) -> str:
    if head_dim not in TENSORRT_ATTENTION_HEAD_SIZES:
        return (
            f"attention head size {head_dim} is not in {list(TENSORRT_ATTENTION_HEAD_SIZES)}: "
            "TensorRT's fused INT8 attention does not apply"
        )
    return ""


class QuantAttention(PlacementRule):
    """TensorRT: nn.MultiheadAttention with quantized input and projection weights."""

    name = "quant_attention"
    qdq = QDQ(
        inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION},
        weights={"w_in": Role.WEIGHT, "w_out": Role.WEIGHT},
    )

    @staticmethod
    def target(q, k, v, embed_dim, num_heads, w_in, b_in, w_out, b_out):
        out = F.multi_head_attention_forward(
            q, k, v, embed_dim, num_heads, w_in, b_in, None, None, False, 0.0, w_out, b_out
        )
        return out, {"mha": out}

    def check(self, m: Match) -> MatchResult:
        embed_dim, heads = m.kwarg("mha", "embed_dim_to_check"), m.kwarg("mha", "num_heads")
        if not isinstance(embed_dim, int) or not isinstance(heads, int):
            return m.fail("attention sizes are not static")
        reason = _head_size_reason(embed_dim // heads)
        if reason:
            return m.fail(reason)
        if not m.all_constant("w_in", "w_out"):
            return m.fail("attention projection weights are not constants")
        return m.ok()


class QuantSDPA(PlacementRule):
    """TensorRT: scaled-dot-product attention with quantized Q, K, V (head size permitting)."""

    name = "quant_sdpa"
    qdq = QDQ(inputs={"q": Role.ACTIVATION, "k": Role.ACTIVATION, "v": Role.ACTIVATION})

    @staticmethod
    def target(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v)
        return out, {"sdpa": out}

    def check(self, m: Match) -> MatchResult:
        shape = m.shape("q")
        if shape is None:
            return m.fail("query shape unknown")
        reason = _head_size_reason(int(shape[-1]))
        return m.fail(reason) if reason else m.ok()


class QuantFusedAttention(PlacementRule):
    """TensorRT: fused attention with quantized q, k, v when the head size suits its kernel."""

    name = "quant_fused_attention"
    module_types = (FusedAttention,)

    def check_module(self, module: FusedModule, node: fx.Node) -> str:
        shape = node_shape(node.args[0]) if node.args else None
        if shape is None:
            return "attention head size unknown (no shape metadata)"
        return _head_size_reason(int(shape[-1]))


class QuantFusedModule(PlacementRule):
    """TensorRT: any other fused module, quantized where its own ``qdq`` says (pooling...)."""

    name = "quant_fused_module"
    module_types = (FusedModule,)


def _canonical_activation(name: str) -> Any:
    return next(target for target, label in ACTIVATIONS.items() if label == name)


# The activations ONNX Runtime folds into QLinearConv / QGemm (the output Q's range clips them).
# After any other (hardswish, hardsigmoid, silu, gelu) ORT's QDQ fusion does not fire and the
# conv or linear would keep running in float between Q/DQ nodes.
ORT_INTEGER_ACTIVATIONS = (None, "relu", "relu6")


def _activation_call(graph: fx.Graph, name: str, path: str, value: fx.Node) -> fx.Node:
    if name == "gelu_tanh":
        return canonical_call(graph, F.gelu, path=path, input=value, approximate="tanh")
    return canonical_call(graph, _canonical_activation(name), path=path, input=value)


class SplitFusedForORT(PreparationRewrite):
    """ONNX Runtime: split fused groups whose inner conv or linear output needs its own Q/DQ.

    ORT forms QLinearConv / QGemm only when the conv's (linear's) output is quantized right after
    it, or after a ReLU/ReLU6 its Q range absorbs. So ``act(conv(x) + r)`` becomes ``conv`` ->
    ``add`` -> ``act``; ``maxpool(act(conv(x)))`` becomes ``act(conv)`` -> ``maxpool``; and a
    conv or linear fused with hardswish, hardsigmoid, SiLU or GELU becomes the bare layer (INT8,
    as ORT's own quantizer places it) followed by the activation, which runs in float between
    DQ and the next Q. The math is unchanged.
    """

    name = "split_fused_for_ort"

    def rewrite_module(self, gm: fx.GraphModule, node: fx.Node, module: nn.Module) -> bool:
        """Replace ``node`` (a fused call ORT cannot run as one integer kernel) by its split."""
        is_add = isinstance(module, FusedConvAdd)
        is_pool = isinstance(module, FusedConvMaxPool)
        activation = getattr(module, "activation", None)
        split_activation = (
            isinstance(module, (FusedConv, FusedLinear))
            and activation not in ORT_INTEGER_ACTIVATIONS
        )
        if not (is_add or is_pool or split_activation):
            return False
        activation_outside = is_add or split_activation
        if isinstance(module, FusedLinear):
            inner: nn.Module = FusedLinear(module.weight, module.bias, kind=module.kind)
        else:
            inner = FusedConv(
                module.weight, module.bias, module.stride, module.padding, module.dilation,
                module.groups, activation=None if activation_outside else activation,
                kind=module.kind,
            )  # fmt: skip
        name = f"{node.target}_{'linear' if isinstance(module, FusedLinear) else 'conv'}"
        gm.add_module(name, inner)
        path = module_path(node)
        with gm.graph.inserting_before(node):
            out = gm.graph.call_module(name, (node.args[0],))
            out.meta[PATH_KEY] = path
            if is_add:
                out = canonical_call(
                    gm.graph, torch.add, path=path, input=out, other=node.args[1], alpha=1
                )
            if activation_outside and activation is not None:
                out = _activation_call(gm.graph, activation, path, out)
            if is_pool:
                out = canonical_call(gm.graph, F.max_pool2d, path=path, input=out, **module.pool)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        return True


TENSORRT_QUANTIZED_PATTERNS = (
    QuantAttention(),
    QuantSDPA(),
    QuantConv("quant_conv"),
    QuantLinear("quant_linear"),
    QuantMatMul(),
    QuantResidualAdd("quant_residual_add", branch_only=True),
    QuantFusedAttention(),
    QuantFusedModule(),
)
ONNXRUNTIME_QUANTIZED_PATTERNS = (
    SplitFusedForORT(),
    QuantConv("quant_conv_ort", output=Role.ACTIVATION),
    QuantLinear("quant_linear_ort", output=Role.ACTIVATION),
    QuantResidualAdd("quant_add_ort", output=Role.ACTIVATION, float_stream=True),
)
