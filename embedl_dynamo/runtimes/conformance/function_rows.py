"""The conformance table's rows for the elementwise functions, products and reductions a
model's graph holds beyond the basic arithmetic of :mod:`.math_rows` (logarithms, rounding,
the inverse trigonometric functions, squares and reciprocals, ``prod``, ``logsumexp``,
``outer``, ``einsum``), each in every spelling Dynamo records it by (``torch.arcsin`` is
``arcsin``). See the package's docstring for the verdicts."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import Difference, OpRow, Rule, Verdict
from embedl_dynamo.runtimes.conformance.shorthands import (
    EXACT,
    EXACT_FLOAT,
    FLOAT,
    NOT_EXPORTED,
    OV_INT32,
    OV_INT_PRODUCT,
    OV_INT_VIA_FLOAT,
    TIE_ORDER,
    both,
    non_finite,
)

__all__ = ["FUNCTION_ROWS"]

_EXACT_INT = Rule(Verdict.EXACT, "int")
_EXACT_BOOL = Rule(Verdict.EXACT, "bool")
_OV_PRODUCT = Rule(Verdict.KEPT, "int", OV_INT_PRODUCT)
_OV_INT32 = Rule(Verdict.KEPT, "int", OV_INT32)
_RECIPROCAL_INT = Rule(Verdict.EXACT, "int", "converted to float32 and inverted, as PyTorch does")
_ATAN2 = (
    "the export writes atan(y / x) with corrections by quadrant, which take the sign of a zero "
    "otherwise: atan2(0.0, -1.0) gives -pi, PyTorch pi; atan2(1.0, -0.0) gives -pi/2, PyTorch "
    "pi/2; of two infinities NaN, PyTorch a multiple of pi/4"
)
_LOGIT_NAN = (
    "with eps, a NaN input gives logit(1 - eps): the export clamps the input with ONNX Clip, "
    "which on ONNX Runtime returns the bound for NaN; PyTorch gives NaN"
)
_LOGSUMEXP_NAN = "a slice holding NaN gives +inf (OpenVINO's ReduceLogSumExp), PyTorch NaN"
_PROD_INF = (
    "a product of an infinity and a zero gives the infinity (ReduceProd), where PyTorch gives NaN"
)
_ORT_PROD_INT = (
    "ONNX Runtime's ReduceProd of integers saturates at int64's extremes where PyTorch wraps, "
    "and rounds a product above 2**53 (9007199254740993 gave 9007199254740992)"
)
_OV_PROD_INT = (
    "OpenVINO's CPU plugin computes the product as int32: one that leaves int32's range "
    "saturates (the extremes of int32 gave 2147483647), where PyTorch's int64 product wraps"
)
_ORT_EINSUM_INT = (
    "ONNX Runtime's integer Einsum saturates at the type's extremes where PyTorch wraps, and "
    "loses the low bits of an int64 sum above 2**53"
)
_ORT_NO_INT = "ONNX Runtime has no integer Floor kernel (the build fails)"
_ORT_BOOL_MUL = "the export squares a bool by ONNX Mul, which ONNX Runtime has no bool kernel of"
_OV_NO_BOOL = "OpenVINO's conversion of the exported graph fails on a bool input"
#: an integer input of a float function: the export leaves out PyTorch's cast to float
_UNCAST = Rule(
    Verdict.KEPT,
    "int",
    "the export applies the op to the integer tensor without PyTorch's cast to float32: ONNX "
    "Runtime refuses the type at build, OpenVINO computes it on the integers (other values "
    "than PyTorch's float results) or fails to convert a bool",
)
_NO_INT_TEST = Rule(
    Verdict.KEPT,
    "int",
    "the export applies IsNaN or IsInf to the integer tensor, which neither runtime takes "
    "(ONNX Runtime refuses the type, OpenVINO's conversion fails)",
)
_OV_TRUTH = (
    "OpenVINO reads an integer through float32 as a truth value: the int32 -2**31 reads as "
    "False, PyTorch True"
)
_OV_NAN_TRUTH = "OpenVINO reads NaN as False, PyTorch as True"
#: logical ops: exact on ONNX Runtime; on OpenVINO bools exact, floats exact but for NaN
_LOGICAL = {
    "onnxruntime": (EXACT,),
    "openvino": (_EXACT_BOOL, EXACT_FLOAT, Rule(Verdict.KEPT, "int", _OV_TRUTH)),
}

FUNCTION_ROWS: tuple[OpRow, ...] = (
    *(OpRow(op, (op,), both(FLOAT, _UNCAST)) for op in ("erf", "log1p", "log2", "log10", "tan")),
    *(
        OpRow(op, (op,), both(FLOAT, _UNCAST), (f"arc{op[1:]}",))
        for op in ("asin", "acos", "atan")  # torch.arcsin is asin's other name
    ),
    OpRow(
        "atan2",
        ("atan2",),
        both(Rule(Verdict.KEPT, "float", _ATAN2), _UNCAST),
        ("arctan2",),
    ),
    OpRow(
        "logit",
        ("logit",),
        both(FLOAT, _UNCAST),
        (),
        (Difference("onnxruntime", "nan", _LOGIT_NAN),),
    ),
    OpRow(
        "logsumexp",
        ("logsumexp",),
        both(FLOAT, _UNCAST),
        (),
        (Difference("openvino", "nan", _LOGSUMEXP_NAN),),
    ),
    OpRow(
        "rsub",
        ("rsub",),
        {"onnxruntime": (FLOAT, _EXACT_INT), "openvino": (EXACT_FLOAT, _OV_INT32)},
    ),
    OpRow("reciprocal", ("reciprocal",), both(EXACT_FLOAT, _RECIPROCAL_INT)),
    OpRow(
        "square",
        ("square",),
        {
            "onnxruntime": (EXACT_FLOAT, Rule(Verdict.KEPT, "bool", _ORT_BOOL_MUL), _EXACT_INT),
            "openvino": (EXACT_FLOAT, Rule(Verdict.KEPT, "bool", _OV_NO_BOOL), _OV_PRODUCT),
        },
    ),
    OpRow(
        "floor",
        ("floor",),
        {
            "onnxruntime": (EXACT_FLOAT, Rule(Verdict.KEPT, "int", _ORT_NO_INT)),
            "openvino": (EXACT_FLOAT, Rule(Verdict.KEPT, "int", OV_INT_VIA_FLOAT)),
        },
    ),
    OpRow(
        "round",
        ("round", "round.decimals_0", "round.decimals_3", "round.decimals_neg_3"),
        both(FLOAT, _EXACT_INT),
    ),
    OpRow(
        "prod",
        ("prod",),
        {
            "onnxruntime": (
                Rule(Verdict.KEPT, "float", _PROD_INF),
                _EXACT_BOOL,
                Rule(Verdict.KEPT, "int", _ORT_PROD_INT),
            ),
            "openvino": (
                Rule(Verdict.KEPT, "float", _PROD_INF),
                _EXACT_BOOL,
                Rule(Verdict.KEPT, "int", _OV_PROD_INT),
            ),
        },
    ),
    *(
        OpRow(op, (op,), _LOGICAL, (), (Difference("openvino", "nan", _OV_NAN_TRUTH),))
        for op in ("logical_or", "logical_xor")
    ),
    OpRow(
        "or_",
        ("bitwise_or",),
        both(_EXACT_BOOL, Rule(Verdict.KEPT, "int", NOT_EXPORTED)),
        ("bitwise_or", "__or__"),
    ),
    OpRow(
        "xor",
        ("bitwise_xor",),
        both(_EXACT_BOOL, Rule(Verdict.KEPT, "int", NOT_EXPORTED)),
        ("bitwise_xor", "__xor__"),
    ),
    *(OpRow(op, (op,), both(EXACT_FLOAT, _NO_INT_TEST)) for op in ("isnan", "isfinite")),
    OpRow("isinf", ("isinf",), both(EXACT)),
    OpRow(
        "outer",
        ("outer",),
        {"onnxruntime": (FLOAT, _EXACT_INT), "openvino": (EXACT_FLOAT, _EXACT_BOOL, _OV_PRODUCT)},
    ),
    OpRow(
        "einsum",
        ("einsum",),
        {
            "onnxruntime": (FLOAT, Rule(Verdict.KEPT, "int", _ORT_EINSUM_INT)),
            "openvino": (FLOAT, _OV_PRODUCT),
        },
    ),
)

#: ops the export refuses (the sweep: "Exporting the operator 'aten::sinh' to ONNX opset
#: version 18 is not supported"), kept by name on both runtimes so the rest of a graph runs
_NOT_EXPORTED = both(Rule(Verdict.KEPT, reason=NOT_EXPORTED))
FUNCTION_ROWS = (
    *FUNCTION_ROWS,
    *(
        OpRow(op, (op,), _NOT_EXPORTED)
        for op in (
            *("sinh", "asinh", "acosh", "atanh", "expm1", "exp2", "deg2rad", "rad2deg"),
            *("hypot", "xlogy", "logaddexp", "copysign", "fmax", "fmin", "trunc", "frac"),
            *("sgn", "signbit", "isneginf", "isposinf", "heaviside"),
        )
    ),
)

_AMINMAX_NAN = (
    "a slice holding NaN gives a number (ReduceMin and ReduceMax skip NaN; amin and amax have "
    "the NaN-propagating form of graph/exact_ops.py, aminmax not), PyTorch NaN"
)
_OV_AMINMAX_INF = (
    "the min of a 0-d +inf, or the max of a 0-d -inf, gives float32's largest finite value "
    "(3.4e38), PyTorch the infinity"
)
_MEAN_INF = (
    "the mean of a slice holding an infinity is that infinity, where PyTorch's var_mean and "
    "std_mean give NaN (Welford's running mean: inf + (x - inf) / n is NaN)"
)

#: rows from the slow OpInfo sweep on both CPU runtimes
FUNCTION_ROWS = (
    *FUNCTION_ROWS,
    OpRow("argsort", ("argsort",), both(Rule(Verdict.KEPT, reason=TIE_ORDER))),
    *(
        OpRow(op, (name,), {"onnxruntime": (FLOAT, _EXACT_INT), "openvino": (FLOAT, _OV_PRODUCT)})
        for op, name in (("cross", "cross"), ("linalg_cross", "linalg.cross"))
    ),
    OpRow(
        "aminmax",
        ("aminmax",),
        both(FLOAT, _EXACT_INT),
        (),
        (
            Difference("onnxruntime", "nan", _AMINMAX_NAN),
            Difference("openvino", "nan", _AMINMAX_NAN),
            *non_finite(_OV_AMINMAX_INF, ("openvino",), ("inf", "-inf")),
        ),
    ),
    *(
        OpRow(
            op,
            (op, f"{op}.unbiased"),
            both(FLOAT),
            (),
            non_finite(_MEAN_INF, edges=("inf", "-inf")),
        )
        for op in ("var_mean", "std_mean")
    ),
    OpRow("addcdiv", ("addcdiv",), both(FLOAT)),
    *(OpRow(op, (op,), _NOT_EXPORTED) for op in ("cummax", "cummin")),
)
