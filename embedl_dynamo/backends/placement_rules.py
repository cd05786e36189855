"""The built-in targets' QDQ placement rules (phase ``quantized``): where each wants Q/DQ.

A :class:`~embedl_dynamo.quant.int8.rules.PlacementRule` rewrites nothing: it *annotates*. Its
``qdq`` says which match names are quantized on the way in (activations), which constant inputs
are weights (per-channel), and whether the output is quantized; ``check`` says when an op stays in
float, and why (the reason lands in the quantization report). ``module_types`` extends a rule to
fused modules (:class:`~embedl_dynamo.patterns.fused_modules.FusedConv`), whose own ``qdq`` names
their inputs and weights; ``check_module`` applies the same policy to them. A variant (ONNX
Runtime's output Q/DQ) is an instance with other arguments, not a subclass.

Placements of the built-in targets (each target lists its rules in its own module; attention
rules are in :mod:`.attention_placement`, ONNX Runtime's preparation in :mod:`.ort_preparation`).
ONNX Runtime's CPU provider forms QLinearConv and QLinearAdd from the onnxruntime placement only;
it runs TensorRT's placement as float convs between Q/DQ:

* **tensorrt**: QDQ on the inputs of Conv/Linear/MatMul; a conv's residual Add quantizes its
  skip input only (the conv branch stays inside the fused group, so TensorRT fuses the Add into
  the conv), an unfused residual Add both inputs; grouped convs whose channels are not multiples of
  4 and attention with head size outside {16, 32, 64} stay in float.
* **onnxruntime**: additionally Q/DQ on each conv's (post-activation) output and on each Add's
  output, so ORT's QDQ transformer forms QLinearConv and QLinearAdd.
* **openvino**: NNCF's CPU placement: the inputs of every conv (depthwise included), linear and
  activation matmul, both inputs of residual adds and of squeeze-excite scales; a max pool's
  input rather than its output; in attention q and k only; a transformer's residual stream
  stays float.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.patterns.attention import FusedLayerNorm
from embedl_dynamo.patterns.fused_modules import FusedConv, FusedLinear
from embedl_dynamo.quant.int8.rules import PlacementRule
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role

__all__ = [
    "QuantChannelScale",
    "QuantConv",
    "QuantFusedModule",
    "QuantLinear",
    "QuantMatMul",
    "QuantResidualAdd",
    "WeightedOpRule",
]


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
        grouped: grouped and depthwise convs run as integer kernels on the target whatever
            their channels per group (OpenVINO's CPU plugin); else those with channels per
            group not multiples of 4 stay float.
    """

    module_types = (FusedConv,)

    def __init__(self, name: str, output: Role | None = None, grouped: bool = False) -> None:
        super().__init__(name, output)
        self.grouped = grouped

    @staticmethod
    def target(x, w, b):
        conv = F.conv2d(x, w, b)
        return conv, {"conv": conv}

    def check(self, m: Match) -> MatchResult:
        if not m.is_constant("w"):
            return m.fail("convolution weight is not a constant")
        reason = self._grouped_reason(m.value("w"), m.kwarg("conv", "groups"))
        return m.fail(reason) if reason else m.ok()

    def check_module(self, module: FusedModule, node: fx.Node) -> str:
        return self._grouped_reason(module.weight, module.groups)

    def _grouped_reason(self, weight: torch.Tensor | None, groups: int) -> str:
        return "" if self.grouped else _grouped_conv_reason(weight, groups)


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
    """An embedding lookup: ``F.embedding``, or an ``nn.Embedding`` kept as a module call by a
    symbolic trace."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        return isinstance(module, nn.Embedding)
    return node.op == "call_function" and node.target is F.embedding


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
    the error with depth. With ``float_stream`` such an add is left float (ONNX Runtime: no
    QLinearAdd, which would round the sum too; NNCF leaves these adds float as well). With
    ``branch_only`` only its other input, the block's output, is quantized (TensorRT: what
    NVIDIA ModelOpt places, so the GEMM before it can run INT8 out).

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
        value = node_value_meta(m["add"])
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            return m.fail(f"an add of {value.dtype}: integers have no 8-bit form")
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


class QuantChannelScale(PlacementRule):
    """Quantize both inputs of a squeeze-excite scale: ``x * gate`` with ``gate`` of shape
    ``(N, C, 1, 1)``.

    OpenVINO's CPU plugin runs the multiply on integers and fuses it into the next conv only
    when both the feature map and the gate arrive quantized (NNCF places both); the feature
    map's Q/DQ then also serves the global pooling that computes the gate.
    """

    name = "quant_channel_scale"
    qdq = QDQ(inputs={"x": Role.ACTIVATION, "gate": Role.ACTIVATION})

    @staticmethod
    def target(x, gate):
        out = torch.mul(x, gate)
        return out, {"mul": out}

    def check(self, m: Match) -> MatchResult:
        if not (isinstance(m["x"], fx.Node) and isinstance(m["gate"], fx.Node)):
            return m.fail("an input is a Python scalar, not an activation")
        if m.is_constant("x") or m.is_constant("gate"):
            return m.fail("an input is a constant (a scale, not a squeeze-excite gate)")
        x, gate = m.shape("x"), m.shape("gate")
        if x is None or gate is None:
            return m.fail("input shapes unknown (no shape metadata)")
        if len(x) != 4 or len(gate) != 4 or tuple(gate[2:]) != (1, 1) or gate[1] != x[1]:
            return m.fail(
                f"shapes {tuple(x)} x {tuple(gate)} are not a feature map times a per-channel gate"
            )
        return m.ok()


class QuantMaxPoolInput(PlacementRule):
    """Quantize a max pool's input where the pool is its only reader (a ResNet stem's
    ``relu(conv) -> max_pool2d``), and drop the Q/DQ the next layers asked for on the pool's
    output.

    Max pooling commutes with a per-tensor quantization (both are monotonic), so one Q/DQ
    before the pool gives the integers the pool would have had after it, and the pool itself
    runs on them. NNCF propagates its quantizer up through max pools the same way; OpenVINO's
    CPU plugin then writes the conv's output as u8 and pools in u8. With the Q/DQ after the
    pool, both ran in f32 on the largest activation of the network.
    """

    name = "quant_max_pool_input"
    qdq = QDQ(inputs={"x": Role.ACTIVATION})

    @staticmethod
    def target(x):
        out = F.max_pool2d(x, 3)
        return out, {"pool": out}

    def check(self, m: Match) -> MatchResult:
        x = m["x"]
        if not isinstance(x, fx.Node) or m.is_constant("x"):
            return m.fail("the pool's input is a constant")
        if m.kwarg("pool", "return_indices"):
            return m.fail("max pool returns indices")
        if len(x.users) != 1:
            return m.fail("the pool's input has other readers (its Q/DQ would reach them)")
        return m.ok()

    def refine(self, activations: dict[str, Role], gm: fx.GraphModule) -> list[str]:
        dropped = []
        for node in gm.graph.nodes:
            pool_input = node.args[0] if node.args else node.kwargs.get("input")
            if (
                node.op == "call_function"
                and node.target is F.max_pool2d
                and node.name in activations
                and isinstance(pool_input, fx.Node)
                and pool_input.name in activations
                and len(pool_input.users) == 1
            ):
                del activations[node.name]
                dropped.append(node.name)
        return dropped


class QuantFusedModule(PlacementRule):
    """TensorRT: any other fused module, quantized where its own ``qdq`` says (pooling...)."""

    name = "quant_fused_module"
    module_types = (FusedModule,)
