"""Shorthands for the conformance table's rules, and the reasons several rows share."""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.rules import CPU_RUNTIMES, Difference, Rule, Verdict

__all__ = [
    "ARG",
    "BOUNDED",
    "CONV_NON_FINITE",
    "EXACT",
    "EXACT_FLOAT",
    "EXTREME",
    "FLOAT",
    "FLOOR_INF",
    "INT_DIV",
    "NAN",
    "OV_CLAMP",
    "OV_INT",
    "OV_INDEX_PUT_INT",
    "OV_INT_PRODUCT",
    "OV_INT_ROW",
    "OV_INT_VIA_FLOAT",
    "OV_NAN_GREATER",
    "OV_SATURATES",
    "POOL_MATRIX",
    "REDUCTION",
    "both",
    "elementwise",
]

EXACT = Rule(Verdict.EXACT)
FLOAT = Rule(Verdict.BOUNDED, "float")
EXACT_FLOAT = Rule(Verdict.EXACT, "float")
BOUNDED = (Rule(Verdict.BOUNDED, "float"), Rule(Verdict.EXACT, "int"))
OV_INT = (
    "OpenVINO's CPU plugin computes int64 as int32: a call whose int64 inputs leave int32's "
    "range runs in PyTorch; an intermediate value outside it wraps"
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


def elementwise(reason_ov: str = OV_INT) -> dict[str, tuple[Rule, ...]]:
    """Float arithmetic bounded; integers exact on ONNX Runtime, bounded by int32 on OpenVINO."""
    return {
        "onnxruntime": BOUNDED,
        "openvino": (BOUNDED[0], Rule(Verdict.BOUNDED, "int", reason_ov)),
    }


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
OV_NAN_GREATER = Rule(Verdict.KEPT, "float", "a NaN compares greater than a number (OpenVINO)")
OV_INT_ROW = Rule(Verdict.BOUNDED, "int", OV_INT)
