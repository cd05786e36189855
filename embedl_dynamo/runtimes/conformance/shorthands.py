"""Shorthands for the conformance table's rules, and the reasons several rows share."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import CPU_RUNTIMES, Difference, Rule, Verdict

__all__ = [
    "ACCUMULATE_ZERO",
    "ARG",
    "BOUNDED",
    "CONV_NON_FINITE",
    "EXACT",
    "EMPTY",
    "EXACT_FLOAT",
    "EXTREME",
    "FLOAT",
    "FLOOR_INF",
    "INDEX_OPS",
    "INT_DIV",
    "NAN",
    "NON_FINITE",
    "NOT_EXPORTED",
    "ORT_WHERE",
    "OV_CLAMP",
    "OV_COMPARE",
    "OV_INT",
    "OV_INDEX_PUT_INT",
    "OV_INT_PRODUCT",
    "OV_INT32",
    "OV_INT_VIA_FLOAT",
    "OV_NAN_GREATER",
    "OV_SATURATES",
    "OV_SATURATES_INT",
    "POOL_MATRIX",
    "REDUCTION",
    "TIE_ORDER",
    "both",
    "elementwise",
    "non_finite",
]

EXACT = Rule(Verdict.EXACT)
FLOAT = Rule(Verdict.BOUNDED, "float")
EXACT_FLOAT = Rule(Verdict.EXACT, "float")
BOUNDED = (Rule(Verdict.BOUNDED, "float"), Rule(Verdict.EXACT, "int"))
OV_INT = (
    "OpenVINO's CPU plugin computes int64 as int32: a call whose int64 inputs or input "
    "dimensions leave [-2**30, 2**30) runs in PyTorch, and a sum the graph cannot bound "
    "within int32 is another row, add(int64 past int32), kept in PyTorch"
)
OV_INDEX_PUT_INT = (
    "on uint8 values OpenVINO wrote an element PyTorch did not (a value of 255 at the first "
    "position, the slow conformance sweep)"
)
OV_INT_PRODUCT = (
    "OpenVINO's CPU plugin computes int64 as int32, and a product leaves int32's range from "
    "inputs well inside it (it would wrap silently; uint8 products saturate)"
)
OV_CLAMP = Difference(
    "openvino",
    "nan",
    "a NaN input gives 0 (OpenVINO's Relu/Clamp); a NaN-propagating form would keep the "
    "activation from fusing into the convolution before it",
)
CONV_NON_FINITE = (
    "a NaN or infinity among a convolution's inputs or weights reaches other outputs than in "
    "PyTorch: the kernels differ in which products they form (the zero padding's taps, "
    "Winograd and GEMM transforms); finite inputs stay within the bound"
)
POOL_MATRIX = (
    "to a size that does not divide the input it is two matrix products "
    "(patterns/adaptive_pool.py): a NaN or infinity reaches every output of its rows and "
    "columns, where PyTorch's windows keep it to the windows holding it"
)
NAN = "exact through the NaN-propagating form of graph/exact_ops.py (IsNaN, Where)"


def both(*rules: Rule) -> dict[str, tuple[Rule, ...]]:
    """The same rules for each CPU runtime."""
    return {name: tuple(rules) for name in CPU_RUNTIMES}


def elementwise(kept_ov: str = "") -> dict[str, tuple[Rule, ...]]:
    """Floats bounded; integers exact on ONNX Runtime; on OpenVINO, integers kept for the
    reason ``kept_ov`` gives (none: exact within int32's range, which the call's guard keeps)."""
    ov_int = Rule(Verdict.KEPT, "int", kept_ov) if kept_ov else Rule(Verdict.BOUNDED, "int", OV_INT)
    return {"onnxruntime": BOUNDED, "openvino": (BOUNDED[0], ov_int)}


ARG = both(Rule(Verdict.EXACT, reason=NAN))
EXTREME = {
    "onnxruntime": (Rule(Verdict.EXACT, reason=NAN),),
    "openvino": (Rule(Verdict.EXACT, "float", NAN), Rule(Verdict.BOUNDED, "int", OV_INT)),
}
OV_INT_VIA_FLOAT = (
    "OpenVINO computes it on integers through float32: values above 2**24 come back changed"
)
REDUCTION = {
    "onnxruntime": (Rule(Verdict.EXACT, reason=NAN),),
    "openvino": (
        Rule(Verdict.EXACT, "float", NAN),
        Rule(Verdict.KEPT, "int", OV_INT_VIA_FLOAT),
    ),
}

FLOOR_INF = (
    "a finite number divided by an infinity of the other sign floors to -0 (Floor of Div), "
    "PyTorch gives -1 as Python does"
)
INT_DIV = (
    "integer division by -1 of the smallest int64 ends the process (SIGFPE in ONNX Runtime's "
    "Div), where PyTorch wraps"
)
OV_SATURATES = (
    "a float infinity converted to another float type gives the largest finite value "
    "(OpenVINO's Convert saturates)"
)
OV_NAN_GREATER = Difference("openvino", "nan", "a NaN compares greater than a number")
OV_COMPARE = (
    "OpenVINO compares integers through float32: of two integers above 2**24 that differ by "
    "one, 16777217 and 16777216, it says they are equal"
)
ORT_WHERE = (
    "a -0.0 taken from a broadcast operand comes back 0.0 (ONNX Runtime's Where): an equal "
    "value, the other sign"
)
ACCUMULATE_ZERO = (
    "with accumulate=True an element no index writes comes back 0.0 for -0.0 (the runtimes "
    "add zeros to it)"
)
EMPTY = (
    "an op on a tensor with a size of 0 computes no values, and runtimes may end the process "
    "on one (SIGFPE: OpenVINO indexing x[0:3, 1] of a (0, 5, 5) tensor, ONNX Runtime "
    "group_norm of a batch of 0 beside another)"
)

#: the edges a per-call guard on non-finite inputs covers
NON_FINITE = ("nan", "inf", "-inf")
NOT_EXPORTED = (
    "the ONNX export refuses it (no ONNX form at the opset used): kept by name, so that the "
    "rest of its graph is exported"
)
OV_INT32 = (
    "OpenVINO's CPU plugin computes int64 as int32 and saturates int8/uint8 (an int64 input "
    "outside int32's range runs in PyTorch, but a result outside it wraps: 2**31 - 1 + 1 "
    "gives -2**31, uint8 250 + 10 gives 255)"
)
OV_SATURATES_INT = (
    "OpenVINO's CPU plugin saturates int8 and uint8 sums where PyTorch wraps: uint8 250 + 10 "
    "gives 255, PyTorch 4"
)
TIE_ORDER = "the indices of tied values come in another order"
#: ops indexing a dimension of their first input; on a 0-d input each is another op
#: (``gather(0-d)``, :func:`~.judge.op_name`)
INDEX_OPS = ("gather", "scatter", "scatter_add", "index_add", "index_copy")


def non_finite(
    reason: str, runtimes: tuple[str, ...] = CPU_RUNTIMES, edges: tuple[str, ...] = NON_FINITE
) -> tuple[Difference, ...]:
    """The same :class:`~.rules.Difference` on non-finite edges for each of ``runtimes``."""
    return tuple(Difference(runtime, edge, reason) for runtime in runtimes for edge in edges)
