"""The conformance table's rows for layers: convolutions, pooling, padding, resizing,
normalizations and activations, in the form Dynamo's graph holds them (``nn.ReLU6`` is
``hardtanh``, ``nn.Upsample`` is ``interpolate``; a ``pad`` or ``interpolate`` of another mode
and a ``softplus`` of another threshold are other ops, :func:`~.judge.op_name`). See the
package's docstring for the verdicts."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import Difference, OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.shorthands import (
    CONV_NON_FINITE,
    EXACT,
    EXACT_FLOAT,
    FLOAT,
    NOT_EXPORTED,
    OV_CLAMP,
    OV_SATURATES_INT,
    both,
    non_finite,
)

__all__ = ["LAYER_ROWS"]

_KEPT = Rule(Verdict.KEPT, reason=NOT_EXPORTED)
_OV_CONV = non_finite(CONV_NON_FINITE, ("openvino",))
_RESIZE = (
    "a NaN or infinity reaches other outputs than in PyTorch: the runtimes weigh the two "
    "neighbours in another form, so a zero weight times an infinity is NaN in one and not "
    "the other"
)
_GROUP_NORM = (
    "an infinity in the input, weight or bias gives inf where PyTorch gives NaN, or the "
    "reverse: PyTorch folds the weight into the normalisation, the runtimes apply it after"
)
_CIRCULAR = Rule(
    Verdict.KEPT,
    reason="the ONNX export ends the process (SIGABRT in the exporter's circular padding) on "
    "an input without a batch axis, F.pad(x of (3, 4, 5), (1, 1, 1, 1), mode='circular')",
)
_UNBATCHED = Rule(
    Verdict.KEPT,
    reason="without a batch axis the runtimes refuse it (ONNX Runtime's AveragePool: 'strides "
    "has incorrect size'; OpenVINO's conversion fails)",
)
_RUNNING_STATS = Rule(
    Verdict.KEPT,
    reason="with running statistics the ONNX export needs a fixed batch size, which a later "
    "call may change",
)
_DIVISOR = Rule(
    Verdict.KEPT,
    reason="the ONNX export drops divisor_override: the runtimes divide by the window's size",
)
_RMS_NORM = Rule(
    Verdict.BOUNDED,
    "float",
    "no ONNX form at the opset used: exported as PyTorch's formula, x * rsqrt(mean(x**2) + eps) "
    "* weight (graph/exact_ops.py)",
)
_LAYERS_TEST = "runtimes/test_conformance_modules.py"
_DEPTH_TO_SPACE = "ONNX Runtime has no integer DepthToSpace kernel (NOT_IMPLEMENTED at build)"
_TANH_INT = Rule(
    Verdict.KEPT,
    "int",
    "the export computes x - tanh(x) on the integer tensor without PyTorch's cast to float32: "
    "ONNX Runtime refuses the type, OpenVINO gives integers (0.0 for tanhshrink(1), PyTorch "
    "0.2384)",
)
_SHRINK_NAN = "a NaN input gives 0 (ONNX Runtime's Shrink), PyTorch NaN"

LAYER_ROWS: tuple[OpRow, ...] = (
    # a listed difference is one the sweep showed: ONNX Runtime's conv1d and conv_transpose
    # matched PyTorch on every non-finite edge tried, as did OpenVINO's conv_transpose1d
    OpRow("conv1d", ("nn.functional.conv1d",), both(FLOAT), (), _OV_CONV),
    OpRow("conv_transpose1d", ("nn.functional.conv_transpose1d",), both(FLOAT)),
    OpRow("conv_transpose2d", ("nn.functional.conv_transpose2d",), both(FLOAT), (), _OV_CONV),
    OpRow("avg_pool1d", ("nn.functional.avg_pool1d",), both(FLOAT)),
    OpRow("avg_pool2d", ("nn.functional.avg_pool2d",), both(FLOAT)),
    *(
        OpRow(f"{op}(unbatched)", (), both(_UNBATCHED), checked_by=_LAYERS_TEST)
        for op in ("avg_pool1d", "avg_pool2d")
    ),
    OpRow("avg_pool2d(divisor_override)", (), both(_DIVISOR), checked_by=_LAYERS_TEST),
    OpRow("pad", ("nn.functional.pad.constant",), both(EXACT)),
    OpRow("pad(mode='reflect')", ("nn.functional.pad.reflect",), both(EXACT)),
    OpRow(
        "pad(mode='replicate')",
        ("nn.functional.pad.replicate", "nn.functional.pad.replicate_negative"),
        both(EXACT),
    ),
    OpRow("pad(mode='circular')", ("nn.functional.pad.circular",), both(_CIRCULAR)),
    OpRow("interpolate(mode='nearest')", ("nn.functional.interpolate.nearest",), both(EXACT)),
    OpRow(
        "interpolate(mode='nearest-exact')",
        ("nn.functional.interpolate.nearest-exact",),
        both(_KEPT),
    ),
    OpRow(
        "interpolate(mode='bilinear')",
        ("nn.functional.interpolate.bilinear",),
        both(FLOAT),
        (),
        non_finite(_RESIZE),
    ),
    OpRow(
        "interpolate(mode='linear')",
        ("nn.functional.interpolate.linear",),
        both(FLOAT),
        (),
        non_finite(_RESIZE),
    ),
    OpRow("interpolate(mode='bicubic')", ("nn.functional.interpolate.bicubic",), both(FLOAT)),
    OpRow("group_norm", ("nn.functional.group_norm",), both(FLOAT), (), non_finite(_GROUP_NORM)),
    OpRow("instance_norm", ("nn.functional.instance_norm",), both(FLOAT)),
    OpRow("instance_norm(running_stats)", (), both(_RUNNING_STATS), checked_by=_LAYERS_TEST),
    OpRow("rms_norm", ("nn.functional.rms_norm",), both(_RMS_NORM)),
    OpRow("_weight_norm", (), both(FLOAT), checked_by="runtimes/test_weight_norm.py"),
    OpRow("leaky_relu", ("nn.functional.leaky_relu",), both(FLOAT)),
    OpRow("hardtanh", ("nn.functional.hardtanh",), both(FLOAT), (), (OV_CLAMP,)),
    OpRow("elu", ("nn.functional.elu",), both(FLOAT)),
    OpRow("mish", ("nn.functional.mish",), both(FLOAT)),
    OpRow("prelu", ("nn.functional.prelu",), both(FLOAT)),
    OpRow("softplus", ("nn.functional.softplus",), both(FLOAT)),
    *(OpRow(op, (f"nn.functional.{op}",), both(FLOAT)) for op in ("selu", "tanhshrink", "glu")),
    OpRow(
        "celu",
        ("nn.functional.celu",),
        both(FLOAT),
        (),
        (Difference("openvino", "nan", "a NaN input gives 0 (OpenVINO), PyTorch NaN"),),
    ),
    OpRow("log_sigmoid", ("nn.functional.logsigmoid",), both(FLOAT), ("logsigmoid",)),
    OpRow(
        "softsign",
        ("nn.functional.softsign",),
        {"onnxruntime": (EXACT,), "openvino": (FLOAT, Rule(Verdict.KEPT, "int", OV_SATURATES_INT))},
    ),
    OpRow(
        "hardshrink",
        ("nn.functional.hardshrink",),
        {"onnxruntime": (FLOAT,), "openvino": (EXACT_FLOAT,)},
        (),
        (Difference("onnxruntime", "nan", _SHRINK_NAN),),
    ),
    OpRow(
        "softshrink",
        ("nn.functional.softshrink",),
        both(FLOAT),
        (),
        (Difference("onnxruntime", "nan", _SHRINK_NAN),),
    ),
    OpRow(
        "pixel_shuffle",
        ("nn.functional.pixel_shuffle",),
        {
            "onnxruntime": (EXACT_FLOAT, Rule(Verdict.KEPT, "int", _DEPTH_TO_SPACE)),
            "openvino": (EXACT,),
        },
    ),
)

_NORMALIZE_INF = (
    "an infinity in a slice comes back as itself and the rest of the slice as about 0, where "
    "PyTorch gives NaN at it and -0.0/0.0 elsewhere (inf / inf): the runtime's norm of it is "
    "float32's largest value"
)
_OV_NORMALIZE_NAN = (
    "a NaN in a slice comes back as NaN at it alone and the rest of the slice divided by eps, "
    "where PyTorch gives NaN for the whole slice: OpenVINO's norm of the slice is 0"
)
_SOFTMIN_NON_FINITE = (
    "a NaN or an infinity in a slice gives other values than PyTorch's NaN for the whole "
    "slice (OpenVINO's SoftMax: NaN at a NaN or a -inf, +inf of -x, and 0 elsewhere; 1.0 for "
    "a slice of one +inf)"
)
_MAX_POOL_NAN = (
    "a window holding NaN gives the window's largest number (the exported max skips NaN), "
    "PyTorch NaN; max_pool2d alone has the NaN-propagating form of graph/exact_ops.py"
)
#: on OpenVINO the sweep's edge values do not show it, one NaN in a random input does
_OV_MAX_POOL = Rule(
    Verdict.KEPT,
    "float",
    f"{_MAX_POOL_NAN} (on OpenVINO one NaN in a random input shows it, the sweep's edge "
    "values do not, so it cannot be a listed difference the suite expects to show)",
)

#: rows from the slow OpInfo sweep on both CPU runtimes
LAYER_ROWS = (
    *LAYER_ROWS,
    OpRow(
        "normalize",
        ("nn.functional.normalize",),
        both(FLOAT),
        (),
        (
            *non_finite(_NORMALIZE_INF, edges=("inf", "-inf")),
            *non_finite(_OV_NORMALIZE_NAN, ("openvino",), ("nan",)),
        ),
    ),
    OpRow(
        "normalize(0-d)",
        (),
        both(FLOAT),
        (),
        non_finite(_NORMALIZE_INF, edges=("inf", "-inf")),
        checked_by="runtimes/test_fold_normalize.py",
    ),
    OpRow("cosine_similarity", ("nn.functional.cosine_similarity",), both(FLOAT)),
    OpRow(
        "softmin",
        ("nn.functional.softmin",),
        both(FLOAT),
        (),
        non_finite(_SOFTMIN_NON_FINITE, ("openvino",)),
    ),
    *(
        OpRow(op, (f"nn.functional.{op}",), both(FLOAT))
        for op in ("avg_pool3d", "adaptive_avg_pool3d")
    ),
    OpRow(
        "max_pool1d",
        ("nn.functional.max_pool1d",),
        both(FLOAT),
        (),
        non_finite(_MAX_POOL_NAN, edges=("nan",)),
    ),
    *(
        OpRow(
            op,
            (f"nn.functional.{op}",),
            {"onnxruntime": (FLOAT,), "openvino": (_OV_MAX_POOL,)},
            (),
            non_finite(_MAX_POOL_NAN, ("onnxruntime",), ("nan",)),
        )
        for op in (
            *("max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d"),
            "adaptive_max_pool3d",
        )
    ),
    OpRow("pixel_unshuffle", ("nn.functional.pixel_unshuffle",), both(EXACT)),
)
