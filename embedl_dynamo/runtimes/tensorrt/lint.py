"""A lint of an ONNX file against what TensorRT's ONNX parser takes, with ``onnx`` only.

TensorRT's explicit quantization and parser rules, checked without TensorRT (so on any machine,
in CI, before a GPU ever sees the file):

* the default-domain opset is in TensorRT's range (TensorRT 10: opsets 9 to 20);
* every op is one onnx-tensorrt supports (its ``docs/operators.md`` support matrix, TensorRT
  10.x: :data:`SUPPORTED_OPS`); ops of other domains (``com.microsoft``) are not;
* Q/DQ zero points are all 0 (TensorRT quantization is symmetric);
* scales are constant initializers, finite and positive;
* weights are stored as int8 initializers read by DequantizeLinear (no QuantizeLinear of a
  constant left for the builder to fold);
* a per-channel weight DequantizeLinear feeding a ``Conv`` quantizes along axis 0 (output
  channels), the only axis TensorRT takes for convolution weights;
* 4-bit weights (:func:`int4_weight_problems`): signed int4 constants, block-quantized along
  ``K`` (``axis=0``, scales ``[K / block_size, N]``), read by a ``MatMul``/``Gemm`` as its
  weight: TensorRT's weight-only INT4 (opset 21, TensorRT 10 and later).
* FP8 (:func:`lint_fp8`): Q/DQ with a float8 zero point need opset 19 or later and the
  ``FLOAT8E4M3FN`` type (TensorRT's FP8 is E4M3), and every FP8 DequantizeLinear feeds a layer
  TensorRT runs in FP8 (Conv, Gemm, MatMul, or a residual Add it fuses into one, through
  data-movement ops; ModelOpt's FP8 op set); an FP8 convolution has
  more than 16 input (per group) and output channels and a filter of at most 32 taps (NVIDIA
  ModelOpt's rule for FP8 convolutions).

:func:`lint_for_tensorrt` returns one line per problem, naming the node; an empty list passes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "FP8_OPS",
    "OPSET_RANGE",
    "SUPPORTED_OPS",
    "int4_weight_problems",
    "lint_for_tensorrt",
    "lint_fp8",
]

OPSET_RANGE = (9, 21)  # 21: blocked int4 DequantizeLinear, which TensorRT 10 parses

# onnx-tensorrt 10.x, docs/operators.md: the operators marked supported
SUPPORTED_OPS = frozenset(
    {
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "And",
        "ArgMax",
        "ArgMin",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "CastLike",
        "Ceil",
        "Celu",
        "Clip",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "ConvTranspose",
        "Cos",
        "Cosh",
        "CumSum",
        "DeformConv",
        "DepthToSpace",
        "DequantizeLinear",
        "Div",
        "Dropout",
        "Einsum",
        "Elu",
        "Equal",
        "Erf",
        "Exp",
        "Expand",
        "EyeLike",
        "Flatten",
        "Floor",
        "GRU",
        "Gather",
        "GatherElements",
        "GatherND",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "GlobalLpPool",
        "GlobalMaxPool",
        "Greater",
        "GreaterOrEqual",
        "GridSample",
        "GroupNormalization",
        "HardSigmoid",
        "HardSwish",
        "Hardmax",
        "Identity",
        "If",
        "ImageScaler",
        "InstanceNormalization",
        "IsInf",
        "IsNaN",
        "LRN",
        "LSTM",
        "LayerNormalization",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "LogSoftmax",
        "Loop",
        "LpNormalization",
        "LpPool",
        "MatMul",
        "Max",
        "MaxPool",
        "Mean",
        "MeanVarianceNormalization",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "NonMaxSuppression",
        "NonZero",
        "Not",
        "OneHot",
        "Or",
        "PRelu",
        "Pad",
        "ParametricSoftplus",
        "Pow",
        "QuantizeLinear",
        "RNN",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Range",
        "Reciprocal",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
        "Relu",
        "Reshape",
        "Resize",
        "ReverseSequence",
        "RoiAlign",
        "Round",
        "ScaledTanh",
        "Scan",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Selu",
        "Shape",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Size",
        "Slice",
        "Softmax",
        "Softplus",
        "Softsign",
        "SpaceToDepth",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Tile",
        "TopK",
        "Transpose",
        "Trilu",
        "Unsqueeze",
        "Upsample",
        "Where",
        "Xor",
    }
)

_QDQ = ("QuantizeLinear", "DequantizeLinear")
# the layers TensorRT runs in FP8, and the ops Q/DQ moves across on the way to them
FP8_OPS = frozenset({"Conv", "Gemm", "MatMul"})
_MOVES_DATA = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
_FP8_TYPES = {
    onnx.TensorProto.FLOAT8E4M3FN: "FLOAT8E4M3FN",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "FLOAT8E4M3FNUZ",
    onnx.TensorProto.FLOAT8E5M2: "FLOAT8E5M2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "FLOAT8E5M2FNUZ",
}


def lint_for_tensorrt(model: onnx.ModelProto) -> list[str]:
    """What TensorRT's parser or explicit quantization would refuse in ``model``; [] passes."""
    problems: list[str] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    low, high = OPSET_RANGE
    if opset is None or not low <= opset <= high:
        problems.append(f"opset {opset} is outside TensorRT's range {low}..{high}")
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:  # topological: an Identity of a constant is that constant
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = attr.t
        elif node.op_type == "Identity" and node.input[0] in constants:
            constants[node.output[0]] = constants[node.input[0]]
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        where = f"{node.op_type} {node.name or node.output[0]}"
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"{where}: op of domain {node.domain!r}; TensorRT parses ai.onnx only")
            continue
        if node.op_type not in SUPPORTED_OPS:
            problems.append(f"{where}: not in onnx-tensorrt's supported operators")
        if node.op_type not in _QDQ:
            continue
        problems += _check_qdq(node, where, constants, consumers)
        problems += int4_weight_problems(node, where, constants, consumers)
    return problems + lint_fp8(model, constants, consumers)


def int4_weight_problems(
    node: onnx.NodeProto,
    where: str,
    constants: dict[str, onnx.TensorProto],
    consumers: dict[str, list[onnx.NodeProto]],
) -> list[str]:
    """What TensorRT's weight-only INT4 refuses in a ``DequantizeLinear`` of 4-bit values.

    Returns:
        One line per problem; [] for a node that reads no 4-bit value or passes.
    """
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    codes = constants.get(node.input[0])
    if node.op_type != "DequantizeLinear" or codes is None or codes.data_type not in four_bit:
        return []
    problems = []
    if codes.data_type == onnx.TensorProto.UINT4:
        problems.append(f"{where}: uint4 weights; TensorRT's INT4 is signed (store int4, zero 0)")
    attrs = {a.name: a.i for a in node.attribute}
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    block = attrs.get("block_size", 0)
    if len(codes.dims) != 2 or block <= 0 or attrs.get("axis", 1) != 0:
        problems.append(f"{where}: int4 weight must be 2-d [K, N], blocked on axis 0")
    elif scale is not None and list(scale.dims) != [codes.dims[0] // block, codes.dims[1]]:
        problems.append(
            f"{where}: int4 scales {list(scale.dims)} are not [K / block_size, N] = "
            f"{[codes.dims[0] // block, codes.dims[1]]}"
        )
    readers = consumers.get(node.output[0], [])
    if not readers or any(
        c.op_type not in ("MatMul", "Gemm") or list(c.input).index(node.output[0]) != 1
        for c in readers
    ):
        problems.append(f"{where}: an int4 weight must be read only as a MatMul/Gemm weight")
    return problems


def _check_qdq(
    node: onnx.NodeProto,
    where: str,
    constants: dict[str, onnx.TensorProto],
    consumers: dict[str, list[onnx.NodeProto]],
) -> list[str]:
    problems = []
    scale_name = node.input[1] if len(node.input) > 1 else ""
    if scale_name not in constants:
        problems.append(f"{where}: scale {scale_name!r} is not a constant initializer")
    else:
        scale = numpy_helper.to_array(constants[scale_name]).astype(np.float64)
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            problems.append(f"{where}: scale {scale_name!r} has non-positive or non-finite values")
    if len(node.input) > 2 and node.input[2]:
        zero = constants.get(node.input[2])
        if zero is None or numpy_helper.to_array(zero).astype(np.int64).any():
            problems.append(f"{where}: zero point must be a constant 0 (TensorRT is symmetric)")
    if node.op_type == "QuantizeLinear" and node.input[0] in constants:
        problems.append(
            f"{where}: quantizes a constant; store the weight as int8 read by DequantizeLinear"
        )
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if node.op_type == "DequantizeLinear" and node.input[0] in constants:
        scale = constants.get(scale_name)
        per_channel = scale is not None and len(scale.dims) == 1 and scale.dims[0] > 1
        feeds_conv_weight = any(
            c.op_type == "Conv" and len(c.input) > 1 and c.input[1] == node.output[0]
            for c in consumers.get(node.output[0], [])
        )
        if per_channel and feeds_conv_weight and axis != 0:
            problems.append(f"{where}: per-channel conv weight quantized on axis {axis}, not 0")
    return problems


def _fp8_layers(
    name: str,
    consumers: dict[str, list[onnx.NodeProto]],
    constants: dict[str, onnx.TensorProto],
) -> list[onnx.NodeProto]:
    """The layers that read ``name`` (directly or through data-movement ops) and that TensorRT
    runs in FP8: Conv, Gemm, MatMul, and a residual Add (two activations), which it fuses into
    the GEMM or convolution producing one of them."""
    found, stack, seen = [], [name], set()
    while stack:
        value = stack.pop()
        for node in consumers.get(value, []):
            residual = node.op_type == "Add" and not any(i in constants for i in node.input)
            if node.op_type in FP8_OPS or residual:
                found.append(node)
            elif node.op_type in _MOVES_DATA and node.output[0] not in seen:
                seen.add(node.output[0])
                stack.append(node.output[0])
    return found


def _fp8_conv_problem(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> str:
    weight = constants.get(node.input[1]) if len(node.input) > 1 else None
    if weight is None:
        return ""
    dims = list(weight.dims)
    if dims[0] <= 16 or dims[1] <= 16:
        return f"with {dims[1]} input (per group) / {dims[0]} output channels, not both above 16"
    if int(np.prod(dims[2:])) > 32:
        return f"with a filter of {int(np.prod(dims[2:]))} taps, above 32"
    return ""


def _dq_sources(graph: onnx.GraphProto) -> dict[str, str]:
    """Each DequantizeLinear's output -> the value it reads (an FP8 conv's weight initializer)."""
    return {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}


def lint_fp8(
    model: onnx.ModelProto,
    constants: dict[str, onnx.TensorProto],
    consumers: dict[str, list[onnx.NodeProto]],
) -> list[str]:
    """TensorRT's FP8 rules (see the module docstring); [] for a file without FP8 Q/DQ."""
    problems: list[str] = []
    fp8_nodes = [
        (node, constants[node.input[2]].data_type)
        for node in model.graph.node
        if node.op_type in _QDQ
        and len(node.input) > 2
        and node.input[2] in constants
        and constants[node.input[2]].data_type in _FP8_TYPES
    ]
    if not fp8_nodes:
        return problems
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 19:
        problems.append(f"FP8 Q/DQ at opset {opset}; float8 types need opset 19 or later")
    dq_weights = _dq_sources(model.graph)
    for node, dtype in fp8_nodes:
        where = f"{node.op_type} {node.name or node.output[0]}"
        if dtype != onnx.TensorProto.FLOAT8E4M3FN:
            problems.append(f"{where}: {_FP8_TYPES[dtype]} zero point; TensorRT's FP8 is E4M3FN")
        if node.op_type != "DequantizeLinear":
            continue
        layers = _fp8_layers(node.output[0], consumers, constants)
        if not layers:
            problems.append(
                f"{where}: FP8 feeds no Conv/Gemm/MatMul or residual Add; TensorRT has no FP8 "
                "kernel there (leave that layer in the float type)"
            )
        for conv in (c for c in layers if c.op_type == "Conv"):
            if len(conv.input) > 1 and conv.input[1] in dq_weights:
                weight = constants.get(dq_weights[conv.input[1]])
                shown = {conv.input[1]: weight} if weight is not None else {}
                problem = _fp8_conv_problem(conv, {**constants, **shown})
            else:
                problem = _fp8_conv_problem(conv, constants)
            if problem:
                problems.append(
                    f"Conv {conv.name or conv.output[0]}: FP8 convolution {problem}; "
                    "TensorRT has no FP8 kernel for it"
                )
    return sorted(set(problems), key=problems.index)
