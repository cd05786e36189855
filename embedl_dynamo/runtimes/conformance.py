"""Op conformance: for each op and CPU runtime, whether the runtime computes it as PyTorch does.

One table, the single source of truth for three readers: the compile keeps a subgraph in
PyTorch when one of its ops is ``kept`` on the runtime that would run it
(:func:`kept_in_pytorch`), the conformance suite (``tests/runtimes/test_conformance.py``)
takes each row as the expected result of PyTorch's own OpInfo samples plus edge values, and
``docs/op-conformance.md`` is generated from it (``python -m bench.op_conformance_doc``).

* ``exact``: the runtime's outputs equal PyTorch's bit for bit (same dtype and shape; NaN and
  infinities where PyTorch has them), on every sample and edge value;
* ``bounded``: floats within :data:`FLOAT_ATOL` absolute or :data:`FLOAT_RTOL` relative to
  the output's scale (kernels reorder sums), NaN and infinities at PyTorch's positions;
  integers and bools still bit for bit;
* ``kept``: the runtime computes it otherwise (the reason says how), so a graph holding it
  runs in PyTorch, with that reason in the report.

Several ``exact`` rows hold only through the forms :mod:`embedl_dynamo.graph.exact_ops` gives
those ops in every export (NaN-propagating ``max``/``argmax``, integer sums by ``CumSum``,
zeros for fully masked attention rows). A row holds for the dtypes it names (``float``:
floating point; ``int``: integers and bools); an op without a row is not judged here.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import fx

from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.graph.view_writes import POSITIONS_META

__all__ = [
    "CPU_RUNTIMES",
    "Difference",
    "FLOAT_ATOL",
    "FLOAT_RTOL",
    "OpRow",
    "ROWS",
    "Rule",
    "Verdict",
    "differences",
    "kept_in_pytorch",
    "op_name",
    "rule_for",
]

#: the runtimes the table speaks for
CPU_RUNTIMES = ("onnxruntime", "openvino")
#: the ``bounded`` verdict's absolute bound on float outputs
FLOAT_ATOL = 1e-5
#: ... and its bound relative to the largest magnitude of the output
FLOAT_RTOL = 1e-4


class Verdict(enum.Enum):
    """How a runtime computes an op, compared with PyTorch."""

    EXACT = "exact"
    BOUNDED = "bounded"
    KEPT = "kept in PyTorch"


@dataclass(frozen=True)
class Rule:
    """The verdict on one op for one runtime and one family of input dtypes.

    Attributes:
        verdict: exact, bounded or kept.
        dtypes: ``float``, ``int`` (integers and bools) or ``any``: the first tensor input's.
        reason: why (for ``kept``: what the runtime computes instead; else how it holds).
    """

    verdict: Verdict
    dtypes: str = "any"
    reason: str = ""

    def covers(self, dtype: torch.dtype | None) -> bool:
        """Whether this rule speaks for an input of ``dtype`` (None: unknown, every rule)."""
        if self.dtypes == "any" or dtype is None:
            return True
        return (self.dtypes == "float") == (dtype.is_floating_point or dtype.is_complex)


@dataclass(frozen=True)
class Difference:
    """A known way a runtime computes an op otherwise than PyTorch on some edge value, neither
    made exact nor kept in PyTorch, since doing so would cost every model the op's speed;
    listed here, in the one place, with its reason (the suite expects it to show).

    Attributes:
        runtime: the runtime.
        edge: the edge values that show it (``nan``, ``inf``, ``-inf``): a suite label prefix.
        reason: what the runtime computes instead, and why it stays.
    """

    runtime: str
    edge: str
    reason: str


@dataclass(frozen=True)
class OpRow:
    """One op: its PyTorch names, the OpInfo entries whose samples check it, the rules.

    Attributes:
        op: the name of the torch function / Tensor method (``torch.max``, ``Tensor.max``).
        opinfo: names in PyTorch's ``op_db`` whose samples check it.
        rules: runtime name -> rules, the first that covers the dtype applies.
        aliases: other names of the op in a graph (``F.relu``, ``relu_``...).
        differs: the known differences on edge values (:class:`Difference`).
    """

    op: str
    opinfo: tuple[str, ...]
    rules: Mapping[str, tuple[Rule, ...]]
    aliases: tuple[str, ...] = field(default=())
    differs: tuple[Difference, ...] = field(default=())


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
        (),  # OpInfo's samples draw dropout: tests/runtimes/test_later_calls.py checks it
        _both(
            Rule(
                Verdict.BOUNDED,
                reason="a query masked by -inf at every key gives zeros, as in PyTorch "
                "(graph/exact_ops.py, patterns/attention_export.py)",
            )
        ),
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
)

_BY_NAME: dict[str, OpRow] = {}
for _row in ROWS:
    for _name in (_row.op, *_row.aliases):
        _BY_NAME[_name] = _row


def op_name(node: fx.Node) -> str | None:
    """The name the table knows ``node``'s op by (None: not a call)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function" or node.target is operator.getitem:
        return None
    return getattr(node.target, "__name__", None)


def rule_for(op: str, runtime: str, dtype: torch.dtype | None) -> Rule | None:
    """The rule on ``op`` for ``runtime`` and an input of ``dtype`` (None: no row for it)."""
    row = _BY_NAME.get(op)
    if row is None:
        return None
    return next((r for r in row.rules.get(runtime, ()) if r.covers(dtype)), None)


def differences(op: str, runtime: str) -> tuple[Difference, ...]:
    """The known differences of ``op`` on ``runtime`` (:class:`Difference`)."""
    row = _BY_NAME.get(op)
    return tuple(d for d in row.differs if d.runtime == runtime) if row is not None else ()


def _input_dtype(node: fx.Node) -> torch.dtype | None:
    for arg in (*node.args, *node.kwargs.values()):
        if isinstance(arg, fx.Node):
            value = node_value_meta(arg)
            dtype = getattr(value, "dtype", None)
            if isinstance(dtype, torch.dtype):
                return dtype
    return None


def kept_in_pytorch(gm: fx.GraphModule, runtimes: Iterable[str]) -> str | None:
    """Why ``gm`` runs in PyTorch rather than on ``runtimes`` (None: nothing keeps it): the
    first op whose row says ``kept`` on one of them, with the row's reason."""
    names = list(runtimes)
    for node in gm.graph.nodes:
        op = op_name(node)
        if op is None or op not in _BY_NAME or node.meta.get(POSITIONS_META):
            continue  # a scatter's element positions are exact below 2**31 elements
        dtype = _input_dtype(node)  # unknown: kept if any of the op's rules keeps it
        for runtime in names:
            rules = _BY_NAME[op].rules.get(runtime, ())
            rule = next((r for r in rules if r.covers(dtype) and r.verdict is Verdict.KEPT), None)
            if rule is not None:
                what = f"{op} on {dtype}" if dtype is not None else op
                return f"{what} stays in PyTorch on {runtime}: {rule.reason}"
    return None
