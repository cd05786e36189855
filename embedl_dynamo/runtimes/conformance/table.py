"""The conformance table: one row per op a Dynamo graph hands a CPU runtime (the allow-list
:func:`~embedl_dynamo.runtimes.conformance.judge.kept_in_pytorch` reads; see the package's
docstring for what the verdicts mean and how each row is checked)."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.fold_rows import FOLD_ROWS
from embedl_dynamo.runtimes.conformance.function_rows import FUNCTION_ROWS
from embedl_dynamo.runtimes.conformance.layer_rows import LAYER_ROWS
from embedl_dynamo.runtimes.conformance.math_rows import MATH_ROWS
from embedl_dynamo.runtimes.conformance.recurrent_rows import RECURRENT_ROWS
from embedl_dynamo.runtimes.conformance.rules import (
    CPU_RUNTIMES,
    STRUCTURAL,
    Difference,
    OpRow,
    Rule,
    Verdict,
)
from embedl_dynamo.runtimes.conformance.shape_rows import SHAPE_ROWS
from embedl_dynamo.runtimes.conformance.shorthands import (
    ACCUMULATE_ZERO,
    ARG,
    BOUNDED,
    CONV_NON_FINITE,
    EMPTY,
    EXACT,
    EXTREME,
    FLOAT,
    FLOOR_INF,
    INT_DIV,
    NAN,
    ORT_WHERE,
    OV_CLAMP,
    OV_COMPARE,
    OV_INDEX_PUT_INT,
    OV_INT32,
    OV_INT_PRODUCT,
    OV_INT_VIA_FLOAT,
    OV_NAN_GREATER,
    OV_SATURATES,
    OV_SATURATES_INT,
    POOL_MATRIX,
    REDUCTION,
    both,
    elementwise,
)

__all__ = ["ROWS"]

# ops that move or pick values (or build them from sizes): exact on every dtype
_MOVES = (
    ("view", ("view",), ()),
    ("reshape", ("reshape",), ()),
    ("transpose", ("transpose",), ("swapaxes", "swapdims")),  # OpInfo's aliases of it
    ("permute", ("permute",), ()),
    ("unsqueeze", ("unsqueeze",), ()),
    ("squeeze", ("squeeze",), ()),
    ("expand", ("expand",), ()),
    ("expand_as", ("expand_as",), ()),
    ("contiguous", ("contiguous",), ()),
    ("clone", ("clone",), ()),
    ("cat", ("cat",), ("concat", "concatenate")),
    ("stack", ("stack",), ()),
    ("chunk", ("chunk",), ()),
    ("split", ("split",), ()),
    ("unbind", ("unbind",), ()),
    ("roll", ("roll",), ()),
    ("flip", ("flip",), ()),
    ("gather", ("gather",), ()),
    ("getitem", ("__getitem__",), ()),
    ("index_copy", ("index_copy",), ()),
    ("new_ones", ("new_ones",), ()),
    ("zeros", ("zeros",), ()),
    ("zeros_like", ("zeros_like",), ()),
    ("arange", ("arange",), ()),
    ("narrow", ("narrow",), ()),
    ("unflatten", ("unflatten",), ()),
    ("full_like", ("full_like",), ()),
    ("t", ("t",), ()),
    ("reshape_as", ("reshape_as",), ()),
    ("ones_like", ("ones_like",), ()),
    ("zero_", ("zero_",), ()),
    ("fill_", ("fill",), ("fill",)),
    ("scatter", ("scatter",), ()),
)
# float functions
_FLOAT_FUNCTIONS = (
    ("pow", ("pow",), ("__pow__",)),
    ("rsqrt", ("rsqrt",), ()),
    ("sin", ("sin",), ()),
    ("cos", ("cos",), ()),
    ("log", ("log",), ()),
    ("sqrt", ("sqrt",), ()),
    ("batch_norm", ("nn.functional.batch_norm",), ()),
)
# comparisons: float bounded; integers exact on ONNX Runtime, through float32 on OpenVINO
_COMPARISONS = (
    ("eq", ("eq",), ("__eq__",)),
    ("ne", ("ne",), ("__ne__",)),
    ("lt", ("lt",), ("__lt__",)),
    ("le", ("le",), ("__le__",)),
)
_STRUCTURE = (
    ("size", "the sizes of a tensor, which the export writes as constants or Shape"),
    ("numel", "the element count of a tensor, as ``size``"),
    ("getattr", "a tensor's attribute (``.shape``, ``.dtype``): no tensor values"),
    ("sym_sum", "a sum of sizes: integer arithmetic on shapes, not on tensor values"),
    ("_log_api_usage_once", "PyTorch's usage logging: computes nothing"),
    ("tensor", "a constant the graph builds from Python numbers: no arithmetic"),
    ("dropout", "the identity at inference; a graph that trains runs eagerly (graph/freeze.py)"),
    ("item", "reads one element as a Python number: no arithmetic"),
    ("empty", "allocates a tensor whose values PyTorch leaves unspecified"),
    ("empty_like", "allocates a tensor whose values PyTorch leaves unspecified"),
)
_MORE_ROWS: tuple[OpRow, ...] = (
    *(OpRow(op, opinfo, both(EXACT), aliases) for op, opinfo, aliases in _MOVES),
    OpRow("float", ("float",), both(EXACT)),
    OpRow(
        "to",
        ("to",),
        both(EXACT),
        ("type_as",),
        tuple(Difference("openvino", edge, OV_SATURATES) for edge in ("inf", "-inf")),
    ),
    OpRow("embedding", ("nn.functional.embedding",), both(EXACT)),
    *(
        OpRow(op, (op,), elementwise(OV_COMPARE), (f"__{op}__",), (OV_NAN_GREATER,))
        for op in ("gt", "ge")
    ),
    OpRow(
        "diff",
        (),  # OpInfo's samples (prepend, append, n > 1) do not export; a decoder's mask does
        {
            "onnxruntime": BOUNDED,
            "openvino": (Rule(Verdict.KEPT, reason="not checked on OpenVINO"),),
        },
        checked_by="dynamo/test_perplexity.py",
    ),
    OpRow(
        "empty_tensor",
        (),  # any op on a tensor with a size of 0 (judge.op_name)
        both(Rule(Verdict.KEPT, reason=EMPTY)),
        checked_by="runtimes/test_conformance.py",
    ),
    OpRow(
        "masked_fill",
        ("masked_fill",),
        {"onnxruntime": (Rule(Verdict.BOUNDED, "float", ORT_WHERE), EXACT), "openvino": (EXACT,)},
        ("masked_fill_",),
    ),
    OpRow(
        "floordiv_by_number",
        (),  # x // 2: no -1 or infinite divisor; graph/division.py rounds towards -inf
        elementwise(OV_INT_VIA_FLOAT),
        checked_by="graph/test_value_semantics.py",
    ),
    OpRow(
        "double",
        ("double",),
        both(EXACT),
        (),
        tuple(Difference("openvino", edge, OV_SATURATES) for edge in ("inf", "-inf")),
    ),
    OpRow("long", ("long",), both(Rule(Verdict.EXACT, "int"))),
    OpRow(
        "index_put",
        ("index_put",),
        {
            "onnxruntime": (Rule(Verdict.BOUNDED, "float", ACCUMULATE_ZERO), EXACT),
            "openvino": (
                Rule(Verdict.BOUNDED, "float", ACCUMULATE_ZERO),
                Rule(Verdict.KEPT, "int", OV_INDEX_PUT_INT),
            ),
        },
        (),
        tuple(
            Difference(
                runtime,
                "ties",
                "duplicate indices: which value lands PyTorch leaves "
                "undefined, and the runtimes pick another",
            )
            for runtime in CPU_RUNTIMES
        ),
    ),
    OpRow(
        "exp",
        ("exp",),
        both(FLOAT),
        (),
        (Difference("openvino", "nan", "exp of NaN gives +inf (OpenVINO)"),),
    ),
    OpRow(
        "diagonal",
        ("diagonal",),
        both(
            Rule(
                Verdict.KEPT,
                reason="reads other elements than PyTorch (the export's form "
                "of an offset or non-contiguous input)",
            )
        ),
    ),
    OpRow("clamp", ("clamp",), elementwise(OV_INT32), (), (OV_CLAMP,)),
    OpRow(
        "floordiv",
        ("floor_divide",),
        both(Rule(Verdict.KEPT, "float", FLOOR_INF), Rule(Verdict.KEPT, "int", INT_DIV)),
        ("floor_divide", "__floordiv__"),
    ),
    *(OpRow(op, opinfo, both(FLOAT), aliases) for op, opinfo, aliases in _FLOAT_FUNCTIONS),
    OpRow(
        "and_",
        ("bitwise_and",),
        elementwise(),
        ("bitwise_and", "__and__", "logical_and"),
    ),
    *(OpRow(op, opinfo, elementwise(OV_COMPARE), aliases) for op, opinfo, aliases in _COMPARISONS),
    *(
        OpRow(op, (), both(Rule(Verdict.EXACT, reason=why)), checked_by=STRUCTURAL)
        for op, why in _STRUCTURE
    ),
    OpRow(
        "multi_head_attention_forward",
        ("nn.functional.multi_head_attention_forward",),
        both(FLOAT),
    ),
    OpRow(
        "_transformer_encoder_layer_fwd",
        (),  # no OpInfo entry: decomposed by graph/attention_forms.py into rows of this table
        both(FLOAT),
        checked_by="dynamo/test_transformer_encoder.py",
    ),
    OpRow(
        "setitem",
        (),  # an in-place write, made functional (graph/functionalize.py, graph/view_writes.py)
        both(EXACT),
        checked_by="graph/test_inplace_idioms.py",
    ),
)


ROWS: tuple[OpRow, ...] = (
    OpRow("argmax", ("argmax",), ARG),
    OpRow("argmin", ("argmin",), ARG),
    OpRow("max", ("max.reduction_no_dim", "max.reduction_with_dim", "max.binary"), REDUCTION),
    OpRow("min", ("min.reduction_no_dim", "min.reduction_with_dim", "min.binary"), REDUCTION),
    OpRow(
        "amax",
        ("amax",),
        {
            "onnxruntime": (
                Rule(Verdict.BOUNDED, "float", f"{NAN}; of -0.0 and 0.0 it may give the other"),
                Rule(Verdict.EXACT, "int", NAN),
            ),
            "openvino": REDUCTION["openvino"],
        },
    ),
    OpRow("amin", ("amin",), REDUCTION),
    OpRow("maximum", ("maximum",), EXTREME),
    OpRow("minimum", ("minimum",), EXTREME),
    OpRow(
        "sum",
        ("sum",),
        {
            "onnxruntime": (
                Rule(Verdict.BOUNDED, "float"),
                Rule(Verdict.EXACT, "int", "int64 added by CumSum (ReduceSum rounds above 2**53)"),
            ),
            "openvino": (
                Rule(Verdict.BOUNDED, "float"),
                Rule(Verdict.KEPT, "int", "int64 sums computed as int32 wrap above 2**31"),
            ),
        },
    ),
    OpRow(
        "topk",
        ("topk",),
        both(Rule(Verdict.KEPT, reason="the indices of tied values come in another order")),
    ),
    OpRow(
        "scaled_dot_product_attention",
        (),  # OpInfo's samples draw dropout
        both(
            Rule(
                Verdict.BOUNDED,
                reason="a query masked by -inf at every key gives zeros, as in PyTorch "
                "(graph/exact_ops.py, patterns/attention_export.py)",
            )
        ),
        checked_by="runtimes/test_later_calls.py",
    ),
    OpRow("softmax", ("softmax",), both(FLOAT)),
    OpRow("log_softmax", ("log_softmax",), both(FLOAT)),
    OpRow(
        "relu",
        ("nn.functional.relu",),
        {
            "onnxruntime": (EXACT,),
            "openvino": (
                Rule(Verdict.BOUNDED, "float", "relu(-0.0) gives 0.0, PyTorch -0.0"),
                Rule(Verdict.KEPT, "int", OV_INT_VIA_FLOAT),
            ),
        },
        ("relu_",),
        (OV_CLAMP,),
    ),
    OpRow("sigmoid", ("sigmoid",), both(FLOAT)),
    OpRow("tanh", ("tanh",), both(FLOAT)),
    OpRow(
        "gelu",
        ("nn.functional.gelu",),
        both(FLOAT),
        (),
        (
            Difference(
                "onnxruntime",
                "inf",
                "gelu(+inf, approximate='tanh'): PyTorch NaN, ONNX Runtime +inf",
            ),
        ),
    ),
    OpRow("silu", ("nn.functional.silu",), both(FLOAT)),
    OpRow("hardswish", ("nn.functional.hardswish",), both(FLOAT)),
    OpRow("hardsigmoid", ("nn.functional.hardsigmoid",), both(FLOAT), (), (OV_CLAMP,)),
    OpRow("relu6", ("nn.functional.relu6",), both(FLOAT), (), (OV_CLAMP,)),
    OpRow("add", ("add",), elementwise(), ("add_", "iadd", "__add__")),
    OpRow("sub", ("sub",), elementwise(), ("sub_", "isub", "__sub__")),
    *(
        OpRow(
            f"{op}(8-bit)",
            (),  # judge.op_name: an int8 or uint8 add or sub
            {"onnxruntime": (EXACT,), "openvino": (Rule(Verdict.KEPT, reason=OV_SATURATES_INT),)},
            checked_by="runtimes/test_later_calls.py",
        )
        for op in ("add", "sub")
    ),
    OpRow(
        "mul",
        ("mul",),
        {
            "onnxruntime": BOUNDED,
            "openvino": (
                BOUNDED[0],
                Rule(Verdict.KEPT, "int", OV_INT_PRODUCT),
            ),
        },
        ("mul_", "imul", "__mul__"),
        tuple(
            Difference("openvino", edge, "uint8 products saturate at 255 instead of wrapping")
            for edge in ("255", "extremes")
        ),
    ),
    OpRow(
        "cumsum",
        ("cumsum",),
        {
            "onnxruntime": (
                FLOAT,
                Rule(Verdict.EXACT, "int", "integers add up in int64 (graph/exact_ops.py)"),
            ),
            "openvino": (
                FLOAT,
                Rule(Verdict.KEPT, "int", "int64 running sums computed as int32 wrap above 2**31"),
            ),
        },
    ),
    OpRow("mean", ("mean",), both(FLOAT)),
    OpRow("matmul", ("matmul",), both(FLOAT), ("__matmul__",)),
    OpRow("linear", ("nn.functional.linear",), both(FLOAT)),
    OpRow("addmm", ("addmm",), both(FLOAT)),
    OpRow(
        "conv2d",
        ("nn.functional.conv2d",),
        both(FLOAT),
        (),
        tuple(
            Difference(runtime, edge, CONV_NON_FINITE)
            for runtime in CPU_RUNTIMES
            for edge in ("nan", "inf", "-inf")
        ),
    ),
    OpRow(
        "max_pool2d",
        ("nn.functional.max_pool2d",),
        both(Rule(Verdict.BOUNDED, "float", "a window holding NaN gives NaN (graph/exact_ops.py)")),
        (),
        tuple(
            Difference(r, "nan", "return_indices=True: the index of a window holding NaN")
            for r in CPU_RUNTIMES
        ),
    ),
    OpRow("adaptive_avg_pool1d", ("nn.functional.adaptive_avg_pool1d",), both(FLOAT)),
    OpRow(
        "adaptive_avg_pool2d",
        ("nn.functional.adaptive_avg_pool2d",),
        both(FLOAT),
        (),
        tuple(
            Difference(runtime, edge, POOL_MATRIX)
            for runtime in CPU_RUNTIMES
            for edge in ("nan", "inf", "-inf")
        ),
    ),
    OpRow("layer_norm", ("nn.functional.layer_norm",), both(FLOAT)),
    OpRow("flatten", ("flatten",), both(EXACT)),
    OpRow(
        "where",
        ("where",),
        {"onnxruntime": (Rule(Verdict.BOUNDED, reason=ORT_WHERE),), "openvino": (EXACT,)},
    ),
    *_MORE_ROWS,
    *LAYER_ROWS,
    *FOLD_ROWS,
    *RECURRENT_ROWS,
    *MATH_ROWS,
    *FUNCTION_ROWS,
    *SHAPE_ROWS,
)
