"""The conformance table: one row per op a Dynamo graph hands a CPU runtime (the allow-list
:func:`~embedl_dynamo.runtimes.conformance.judge.kept_in_pytorch` reads; see the package's
docstring for what the verdicts mean and how each row is checked)."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import (
    CPU_RUNTIMES,
    STRUCTURAL,
    Difference,
    OpRow,
    Rule,
    Verdict,
)

__all__ = ["ROWS"]

_EXACT = Rule(Verdict.EXACT)
_FLOAT = Rule(Verdict.BOUNDED, "float")
_EXACT_FLOAT = Rule(Verdict.EXACT, "float")
_BOUNDED = (Rule(Verdict.BOUNDED, "float"), Rule(Verdict.EXACT, "int"))
_OV_INT = (
    "OpenVINO's CPU plugin computes int64 as int32: a call whose int64 inputs leave int32's "
    "range runs in PyTorch; an intermediate value outside it wraps"
)
_OV_CLAMP = Difference(
    "openvino",
    "nan",
    "a NaN input gives 0 (OpenVINO's Relu/Clamp); a NaN-propagating form would keep the "
    "activation from fusing into the convolution before it",
)
_CONV_NON_FINITE = (
    "a NaN or infinity among a convolution's inputs or weights reaches other outputs than in "
    "PyTorch: the kernels differ in which products they form (the zero padding's taps, "
    "Winograd and GEMM transforms); finite inputs stay within the bound"
)
_POOL_MATRIX = (
    "to a size that does not divide the input it is two matrix products "
    "(patterns/adaptive_pool.py): a NaN or infinity reaches every output of its rows and "
    "columns, where PyTorch's windows keep it to the windows holding it"
)
_NAN = "exact through the NaN-propagating form of graph/exact_ops.py (IsNaN, Where)"


def _both(*rules: Rule) -> dict[str, tuple[Rule, ...]]:
    return {name: tuple(rules) for name in CPU_RUNTIMES}


def _elementwise(reason_ov: str = _OV_INT) -> dict[str, tuple[Rule, ...]]:
    """Float arithmetic bounded; integers exact on ONNX Runtime, bounded by int32 on OpenVINO."""
    return {
        "onnxruntime": _BOUNDED,
        "openvino": (_BOUNDED[0], Rule(Verdict.BOUNDED, "int", reason_ov)),
    }


_ARG = _both(Rule(Verdict.EXACT, reason=_NAN))
_EXTREME = {
    "onnxruntime": (Rule(Verdict.EXACT, reason=_NAN),),
    "openvino": (Rule(Verdict.EXACT, "float", _NAN), Rule(Verdict.BOUNDED, "int", _OV_INT)),
}
_OV_INT_VIA_FLOAT = (
    "OpenVINO computes it on integers through float32: values above 2**24 come back changed"
)
_REDUCTION = {
    "onnxruntime": (Rule(Verdict.EXACT, reason=_NAN),),
    "openvino": (
        Rule(Verdict.EXACT, "float", _NAN),
        Rule(Verdict.KEPT, "int", _OV_INT_VIA_FLOAT),
    ),
}

_FLOOR_INF = (
    "a finite number divided by an infinity of the other sign floors to -0 (Floor of Div), "
    "PyTorch gives -1 as Python does"
)
_INT_DIV = (
    "integer division by -1 of the smallest int64 ends the process (SIGFPE in ONNX Runtime's "
    "Div), where PyTorch wraps"
)
_OV_SATURATES = (
    "a float infinity converted to another float type gives the largest finite value "
    "(OpenVINO's Convert saturates)"
)
_OV_NAN_GREATER = Rule(Verdict.KEPT, "float", "a NaN compares greater than a number (OpenVINO)")
_OV_INT_ROW = Rule(Verdict.BOUNDED, "int", _OV_INT)
# ops that move or pick values (or build them from sizes): exact on every dtype
_MOVES = (
    ("view", ("view",), ()),
    ("reshape", ("reshape",), ()),
    ("transpose", ("transpose",), ()),
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
    ("gather", ("gather",), ()),
    ("getitem", ("__getitem__",), ()),
    ("index_copy", ("index_copy",), ()),
    ("masked_fill", ("masked_fill",), ("masked_fill_",)),
    ("new_ones", ("new_ones",), ()),
    ("zeros", ("zeros",), ()),
    ("zeros_like", ("zeros_like",), ()),
    ("arange", ("arange",), ()),
    ("narrow", ("narrow",), ()),
    ("t", ("t",), ()),
    ("reshape_as", ("reshape_as",), ()),
    ("ones_like", ("ones_like",), ()),
    ("zero_", ("zero_",), ()),
    ("fill_", ("fill",), ("fill",)),
    ("index_add", ("index_add",), ()),
    ("scatter", ("scatter",), ()),
)
# dtype conversions
# float functions
_FLOAT_FUNCTIONS = (
    ("neg", ("neg",), ("__neg__",)),
    ("pow", ("pow",), ("__pow__",)),
    ("rsqrt", ("rsqrt",), ()),
    ("sin", ("sin",), ()),
    ("cos", ("cos",), ()),
    ("truediv", ("true_divide",), ("true_divide", "__truediv__")),
    ("div", ("div.no_rounding_mode",), ()),
    ("log", ("log",), ()),
    ("sqrt", ("sqrt",), ()),
    ("batch_norm", ("nn.functional.batch_norm",), ()),
)
# integer arithmetic, comparisons and logic: float bounded; integers exact (int32 on OpenVINO)
_ELEMENTWISE = (
    ("and_", ("bitwise_and",), ("bitwise_and", "__and__", "logical_and")),
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
    *(OpRow(op, opinfo, _both(_EXACT), aliases) for op, opinfo, aliases in _MOVES),
    OpRow("float", ("float",), _both(_EXACT)),
    OpRow(
        "to",
        ("to",),
        _both(_EXACT),
        ("type_as",),
        tuple(Difference("openvino", edge, _OV_SATURATES) for edge in ("inf", "-inf")),
    ),
    OpRow("embedding", ("nn.functional.embedding",), _both(_EXACT)),
    *(
        OpRow(
            op,
            (op,),
            {"onnxruntime": _BOUNDED, "openvino": (_OV_NAN_GREATER, _OV_INT_ROW)},
            (f"__{op}__",),
        )
        for op in ("gt", "ge")
    ),
    OpRow(
        "diff",
        (),  # OpInfo's samples do not export; a decoder's packed-sequence mask does
        {
            "onnxruntime": _BOUNDED,
            "openvino": (Rule(Verdict.KEPT, reason="not checked on OpenVINO"),),
        },
        checked_by="dynamo/test_perplexity.py",
    ),
    OpRow(
        "floordiv_by_number",
        (),  # x // 2: no -1 or infinite divisor; graph/division.py rounds towards -inf
        _elementwise(),
        checked_by="graph/test_value_semantics.py",
    ),
    OpRow(
        "double",
        ("double",),
        _both(_EXACT),
        (),
        tuple(Difference("openvino", edge, _OV_SATURATES) for edge in ("inf", "-inf")),
    ),
    OpRow(
        "long",
        ("long",),
        _both(_EXACT),
        (),
        tuple(
            Difference(
                "openvino",
                edge,
                "a NaN or infinity converted to int64 gives int32's smallest value "
                "(PyTorch int64's; C leaves it undefined)",
            )
            for edge in ("nan", "inf", "-inf")
        ),
    ),
    OpRow(
        "index_put",
        ("index_put",),
        _both(_EXACT),
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
        {
            "onnxruntime": (_FLOAT,),
            "openvino": (Rule(Verdict.KEPT, "float", "exp of NaN gives +inf (OpenVINO)"),),
        },
    ),
    OpRow(
        "diagonal",
        ("diagonal",),
        _both(
            Rule(
                Verdict.KEPT,
                reason="reads other elements than PyTorch (the export's form "
                "of an offset or non-contiguous input)",
            )
        ),
    ),
    OpRow(
        "clamp",
        ("clamp",),
        {
            "onnxruntime": (_FLOAT,),
            "openvino": (
                Rule(Verdict.KEPT, "float", "a NaN input gives a bound (OpenVINO's Clamp)"),
            ),
        },
    ),
    OpRow(
        "floordiv",
        ("floor_divide",),
        _both(Rule(Verdict.KEPT, "float", _FLOOR_INF), Rule(Verdict.KEPT, "int", _INT_DIV)),
        ("floor_divide", "__floordiv__"),
    ),
    *(OpRow(op, opinfo, _both(_FLOAT), aliases) for op, opinfo, aliases in _FLOAT_FUNCTIONS),
    *(OpRow(op, opinfo, _elementwise(), aliases) for op, opinfo, aliases in _ELEMENTWISE),
    *(
        OpRow(op, (), _both(Rule(Verdict.EXACT, reason=why)), checked_by=STRUCTURAL)
        for op, why in _STRUCTURE
    ),
    OpRow(
        "multi_head_attention_forward",
        ("nn.functional.multi_head_attention_forward",),
        _both(_FLOAT),
    ),
    OpRow(
        "_transformer_encoder_layer_fwd",
        (),  # no OpInfo entry: decomposed by graph/attention_forms.py into rows of this table
        _both(_FLOAT),
        checked_by="dynamo/test_transformer_encoder.py",
    ),
    OpRow(
        "setitem",
        (),  # an in-place write, made functional (graph/functionalize.py, graph/view_writes.py)
        _both(_EXACT),
        checked_by="graph/test_inplace_idioms.py",
    ),
)


ROWS: tuple[OpRow, ...] = (
    OpRow("argmax", ("argmax",), _ARG),
    OpRow("argmin", ("argmin",), _ARG),
    OpRow("max", ("max.reduction_no_dim", "max.reduction_with_dim", "max.binary"), _REDUCTION),
    OpRow("min", ("min.reduction_no_dim", "min.reduction_with_dim", "min.binary"), _REDUCTION),
    OpRow("amax", ("amax",), _REDUCTION),
    OpRow("amin", ("amin",), _REDUCTION),
    OpRow("maximum", ("maximum",), _EXTREME),
    OpRow("minimum", ("minimum",), _EXTREME),
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
        _both(Rule(Verdict.KEPT, reason="the indices of tied values come in another order")),
    ),
    OpRow(
        "scaled_dot_product_attention",
        (),  # OpInfo's samples draw dropout
        _both(
            Rule(
                Verdict.BOUNDED,
                reason="a query masked by -inf at every key gives zeros, as in PyTorch "
                "(graph/exact_ops.py, patterns/attention_export.py)",
            )
        ),
        checked_by="runtimes/test_later_calls.py",
    ),
    OpRow("softmax", ("softmax",), _both(_FLOAT)),
    OpRow("log_softmax", ("log_softmax",), _both(_FLOAT)),
    OpRow(
        "relu",
        ("nn.functional.relu",),
        {
            "onnxruntime": (_EXACT,),
            "openvino": (_EXACT_FLOAT, Rule(Verdict.KEPT, "int", _OV_INT_VIA_FLOAT)),
        },
        ("relu_",),
        (_OV_CLAMP,),
    ),
    OpRow("sigmoid", ("sigmoid",), _both(_FLOAT)),
    OpRow("tanh", ("tanh",), _both(_FLOAT)),
    OpRow(
        "gelu",
        ("nn.functional.gelu",),
        _both(_FLOAT),
        (),
        (
            Difference(
                "onnxruntime",
                "inf",
                "gelu(+inf, approximate='tanh'): PyTorch NaN, ONNX Runtime +inf",
            ),
        ),
    ),
    OpRow("silu", ("nn.functional.silu",), _both(_FLOAT)),
    OpRow("hardswish", ("nn.functional.hardswish",), _both(_FLOAT)),
    OpRow("hardsigmoid", ("nn.functional.hardsigmoid",), _both(_FLOAT), (), (_OV_CLAMP,)),
    OpRow("relu6", ("nn.functional.relu6",), _both(_FLOAT), (), (_OV_CLAMP,)),
    OpRow("add", ("add",), _elementwise(), ("add_", "iadd", "__add__")),
    OpRow("sub", ("sub",), _elementwise(), ("sub_", "isub", "__sub__")),
    OpRow(
        "mul",
        ("mul",),
        _elementwise(),
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
                _FLOAT,
                Rule(Verdict.EXACT, "int", "integers add up in int64 (graph/exact_ops.py)"),
            ),
            "openvino": (
                _FLOAT,
                Rule(Verdict.KEPT, "int", "int64 running sums computed as int32 wrap above 2**31"),
            ),
        },
    ),
    OpRow("mean", ("mean",), _both(_FLOAT)),
    OpRow("matmul", ("matmul",), _both(_FLOAT), ("__matmul__",)),
    OpRow("linear", ("nn.functional.linear",), _both(_FLOAT)),
    OpRow("addmm", ("addmm",), _both(_FLOAT)),
    OpRow(
        "conv2d",
        ("nn.functional.conv2d",),
        _both(_FLOAT),
        (),
        tuple(
            Difference(runtime, edge, _CONV_NON_FINITE)
            for runtime in CPU_RUNTIMES
            for edge in ("nan", "inf", "-inf")
        ),
    ),
    OpRow(
        "max_pool2d",
        ("nn.functional.max_pool2d",),
        _both(
            Rule(Verdict.BOUNDED, "float", "a window holding NaN gives NaN (graph/exact_ops.py)")
        ),
        (),
        tuple(
            Difference(r, "nan", "return_indices=True: the index of a window holding NaN")
            for r in CPU_RUNTIMES
        ),
    ),
    OpRow(
        "adaptive_avg_pool2d",
        ("nn.functional.adaptive_avg_pool2d",),
        _both(_FLOAT),
        (),
        tuple(
            Difference(runtime, edge, _POOL_MATRIX)
            for runtime in CPU_RUNTIMES
            for edge in ("nan", "inf", "-inf")
        ),
    ),
    OpRow("layer_norm", ("nn.functional.layer_norm",), _both(_FLOAT)),
    OpRow("flatten", ("flatten",), _both(_EXACT)),
    OpRow("where", ("where",), _both(_EXACT)),
    *_MORE_ROWS,
)
