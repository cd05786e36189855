"""Where FP8 goes: the TensorRT target's INT8 placement, kept where TensorRT has FP8 kernels.

TensorRT runs FP8 (E4M3) in its GEMM-class layers: convolutions, fully connected layers and
matrix multiplies, attention's ``q k^T`` and ``probs v`` included (its fused FP8 attention), and
fuses a residual Add into the GEMM or convolution that produces one of its inputs. NVIDIA
ModelOpt's FP8 mode quantizes exactly these ("Conv, Gemm, MatMul and Residual-Add",
``modelopt.onnx.quantization.fp8``). Pooling and normalisation have no FP8 kernel: a Q/DQ there
only adds a rounding. So FP8 keeps, of the INT8 placement's layers (by rule name):

* ``quant_linear``, ``quant_matmul``, ``quant_attention``, ``quant_sdpa``,
  ``quant_fused_attention``: GEMMs, always;
* ``quant_residual_add``: the residual Adds INT8 quantizes (a transformer's: its branch input);
* ``quant_conv``: a convolution with more than 16 input channels (per group) and more than 16
  output channels and a filter of at most 32 taps, ModelOpt's FP8 rule
  (``graph_utils.find_nodes_from_convs_to_exclude``): smaller ones have no FP8 kernel or run
  faster in FP16; they stay float;
* ``quant_fused_module``: the attention probabilities (``q k^T``) and fused projections (a
  weight matrix); pooling stays float;

and every other layer stays in the graph's float type, with the reason in the report.
"""

from __future__ import annotations

import math

from torch import fx, nn

from embedl_dynamo.graph.nodes import constant_value
from embedl_dynamo.patterns.attention import AttentionProbs
from embedl_dynamo.patterns.fused_modules import FusedConv
from embedl_dynamo.quant.int8.placement import Placement

__all__ = [
    "FP8_CONV_MAX_FILTER",
    "FP8_CONV_MIN_CHANNELS",
    "FP8_RULES",
    "fp8_float_reasons",
    "fp8_placement",
]

FP8_RULES = frozenset(
    {
        "quant_linear",
        "quant_matmul",
        "quant_attention",
        "quant_sdpa",
        "quant_fused_attention",
        "quant_residual_add",
    }
)
FP8_CONV_MIN_CHANNELS = 16
FP8_CONV_MAX_FILTER = 32


def _conv_reason(weight: object, groups: int) -> str:
    shape = tuple(getattr(weight, "shape", ()))
    if len(shape) < 3:
        return "convolution weight shape unknown"
    out_ch, in_ch = shape[:2]  # in_ch: per group
    m = FP8_CONV_MIN_CHANNELS
    if out_ch <= m or in_ch <= m:
        what = f"{in_ch} input channels" + (" per group" if groups > 1 else "")
        return (
            f"convolution with {what} / {out_ch} output channels, not both above {m}: "
            "TensorRT's FP8 kernels do not pay there (ModelOpt's rule)"
        )
    area = math.prod(shape[2:])
    if area > FP8_CONV_MAX_FILTER:
        return (
            f"convolution filter of {area} taps, above {FP8_CONV_MAX_FILTER}: TensorRT has no "
            "FP8 kernel for it (ModelOpt's rule)"
        )
    return ""


def _layer_reason(gm: fx.GraphModule, ident: str, node: fx.Node, module: nn.Module | None) -> str:
    rule = ident.partition("@")[0]
    if rule in FP8_RULES:
        return ""
    if rule == "quant_conv":
        if isinstance(module, FusedConv):
            return _conv_reason(module.weight, module.groups)
        weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
        if isinstance(weight, fx.Node) and weight.op == "get_attr":
            return _conv_reason(constant_value(gm, weight), int(groups))
        return "convolution weight is not a constant"
    if rule == "quant_fused_module":
        if isinstance(module, AttentionProbs):
            return ""
        weight = getattr(module, "weight", None)
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
            return ""  # a projection: one GEMM
        kind = type(module).__name__ if module is not None else node.op
        return f"{kind}: TensorRT has no FP8 kernel for it (not a GEMM)"
    return f"{rule}: not a GEMM, convolution or residual Add; TensorRT has no FP8 kernel for it"


def fp8_float_reasons(gm: fx.GraphModule, placement: Placement) -> dict[str, str]:
    """``{layer id: why it stays float}`` for the INT8 placement's layers FP8 does not take."""
    nodes = {n.name: n for n in gm.graph.nodes}
    reasons = {}
    for ident in placement.quantized_layers:
        layer = placement.layers[ident]
        module = gm.get_submodule(layer.module) if layer.module else None
        reason = _layer_reason(gm, ident, nodes[layer.node], module)
        if reason:
            reasons[ident] = reason
    return reasons


def fp8_placement(gm: fx.GraphModule, placement: Placement) -> Placement:
    """The FP8 placement from the TensorRT target's INT8 ``placement`` of ``gm``.

    Returns:
        A new :class:`Placement`: the FP8 layers with their INT8 points; the others moved to
        ``float_layers`` with the reason.
    """
    reasons = fp8_float_reasons(gm, placement)
    for reason in sorted(set(reasons.values())):
        placement = placement.without({i for i, r in reasons.items() if r == reason}, reason)
    return placement
