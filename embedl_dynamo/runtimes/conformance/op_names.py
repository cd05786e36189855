"""The name the conformance table knows a graph node's op by.

A Tensor method and a torch function share a name; where an argument makes the node another
computation, so does its name (``float_to_int``, ``pad(mode='reflect')``, ``empty_tensor``,
``lstm(proj_size)``...), so that the table judges the computation the node makes.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import fx

from embedl_dynamo.graph.batch_statistics import uses_batch_statistics
from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.graph.strided_reads import strides_own_elements
from embedl_dynamo.runtimes.conformance.int_bounds import (
    computed_within_int32,
    exact_in_float32,
    fits_int32,
)
from embedl_dynamo.runtimes.conformance.recurrent_rows import RECURRENT_OPS
from embedl_dynamo.runtimes.conformance.shorthands import INDEX_OPS

__all__ = ["OPINFO_ALIASES", "input_dtype", "op_name"]

#: other names of ops the table has rows for, as PyTorch's OpInfo lists them (``torch.multiply``
#: is ``mul``): a node calling one is judged as the op, its specialisations included (an 8-bit
#: ``subtract`` is ``sub(8-bit)``); ``tests/runtimes/test_conformance_table.py`` checks the list
#: against OpInfo's
OPINFO_ALIASES = {
    "absolute": "abs",
    "arccosh": "acosh",
    "arcsinh": "asinh",
    "arctanh": "atanh",
    "clip": "clamp",
    "fix": "trunc",
    "ger": "outer",
    "greater": "gt",
    "greater_equal": "ge",
    "less": "lt",
    "less_equal": "le",
    "linalg_matmul": "matmul",
    "multiply": "mul",
    "negative": "neg",
    "not_equal": "ne",
    "row_stack": "vstack",
    "special_erf": "erf",
    "special_exp2": "exp2",
    "special_expit": "sigmoid",
    "special_expm1": "expm1",
    "special_log1p": "log1p",
    "special_log_softmax": "log_softmax",
    "special_logit": "logit",
    "special_logsumexp": "logsumexp",
    "special_round": "round",
    "special_softmax": "softmax",
    "special_xlogy": "xlogy",
    "subtract": "sub",
}


def op_name(node: fx.Node) -> str | None:
    """The name the table knows ``node``'s op by (None: not a call, or picking one output of
    a multi-output op, which computes nothing). A Tensor method and a torch function share
    it; where an argument makes it another computation, so does the name (``float_to_int``,
    ``pad(mode='reflect')``, ``floordiv_by_number``, ``empty_tensor``, ``gather(0-d)``), and
    ``Tensor.unfold`` (a window over one dimension) is not ``F.unfold`` (patches)."""
    if node.op == "call_method":
        return _specialised(node, _unaliased(str(node.target)))
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        source = node.args[0]
        picked = node_value_meta(source) if isinstance(source, fx.Node) else source
        if isinstance(picked, (tuple, list)):
            return None
        return _specialised(node, "getitem")  # a tensor: indexing
    name = getattr(node.target, "__name__", None) or str(node.target)
    return _specialised(node, _unaliased(name))


def _unaliased(name: str) -> str:
    """The op's own name for an alias of it, in place (``multiply_``) or not."""
    if name.endswith("_") and name[:-1] in OPINFO_ALIASES:
        return f"{OPINFO_ALIASES[name[:-1]]}_"
    return OPINFO_ALIASES.get(name, name)


def _specialised(node: fx.Node, name: str) -> str:
    """``name``, or the name of the other computation ``node``'s arguments make it."""
    if _touches_empty(node, name) and not _empty_safe(node, name):
        return "empty_tensor"  # computes nothing; runtimes may end the process on one
    if name == "embedding" and _max_norm(node) is not None:
        return "embedding_renorm_"  # rescales the weight's rows in place first: another op
    if name in ("floordiv", "floor_divide") and _plain_divisor(node):
        return "floordiv_by_number"  # neither -1 nor an infinity: another row
    if name == "div" and node.kwargs.get("rounding_mode") == "floor" and _plain_divisor(node):
        return "floordiv_by_number"  # x.div(2, rounding_mode="floor") is x // 2
    if name == "div" and node.kwargs.get("rounding_mode") is not None:
        return f"div(rounding_mode={node.kwargs['rounding_mode']!r})"  # floor or trunc: another op
    if name in _CASTS and _float_to_int(node):
        return "float_to_int"  # rounds towards zero, and may leave the integer type's range
    if name in _INVERTS and input_dtype(node) == torch.bool:
        return "logical_not"  # ~ of a bool is its logical not
    if name == "softplus" and _argument(node, 2, "threshold", 20.0) != 20.0:
        return f"softplus(threshold={_argument(node, 2, 'threshold', 20.0)!r})"  # not exported
    if name in _SUMS and input_dtype(node) in (torch.int8, torch.uint8):
        return f"{_SUMS[name]}(8-bit)"  # OpenVINO saturates where PyTorch wraps
    if name in _COMPARES and _integer_or_bool(input_dtype(node)) and exact_in_float32(node):
        return f"{_COMPARES[name]}(one side within 2**24)"  # exact through float32 too
    if name in _SUMS and _result_dtype(node) == torch.int64 and not fits_int32(node):
        return f"{_SUMS[name]}(int64 past int32)"  # OpenVINO computes int64 as int32
    if name in _INT32_ARITHMETIC and _result_dtype(node) in (torch.int64, torch.int32):
        if computed_within_int32(node):  # so OpenVINO's int32 computes it exactly
            return f"{_INT32_ARITHMETIC[name]}(within int32)"
    if name == "unfold" and node.target is not torch.nn.functional.unfold:
        return "Tensor.unfold"  # a sliding window of one dimension, not F.unfold's patches
    if name in _BATCHED_RANK and _input_rank(node) != _BATCHED_RANK[name]:
        return f"{name}(unbatched)"  # the runtimes' forms take a batch axis only
    if name == "fold" and len(set(_pair(_argument(node, 4, "padding", 0)))) > 1:
        return "fold(unequal padding)"  # exported with another padding
    if name == "normalize" and _input_rank(node) == 0:
        return "normalize(0-d)"  # exported in graph/exact_ops' rank-1 form: a row of its own
    if name == "avg_pool2d" and _argument(node, 6, "divisor_override", None) is not None:
        return "avg_pool2d(divisor_override)"  # the ONNX export drops the divisor
    if name == "instance_norm" and _argument(node, 1, "running_mean", None) is not None:
        return "instance_norm(running_stats)"  # not exported for a batch size a call may change
    if name in INDEX_OPS and _input_rank(node) == 0:
        return f"{name}(0-d)"  # ONNX's GatherElements and ScatterElements take no 0-d tensor
    if name == "batch_norm" and uses_batch_statistics(node):
        return "batch_norm(batch statistics)"  # one freezing did not write as its ops: no row
    if name == "repeat_interleave" and isinstance(_argument(node, 1, "repeats", None), int):
        return "repeat_interleave(int repeats)"  # a copy of each slice: tensor repeats are not
    if name == "as_strided" and not strides_own_elements(node):
        return "as_strided(storage)"  # reads memory the runtime's contiguous copy lacks
    if name == "scatter" and node.kwargs.get("reduce") is not None:
        return f"scatter(reduce={node.kwargs['reduce']!r})"  # not exported
    if name in _MODES:
        return _with_mode(node, name)
    if name == "tensor_split":
        return _tensor_split(node)
    if name in RECURRENT_OPS:
        return _recurrent(node, name)
    return name


def _tensor_split(node: fx.Node) -> str:
    """``tensor_split`` into a number of sections; at a list of indices, another row (OpenVINO
    cannot convert its export); at a tensor of them, another op (sizes read from data)."""
    kwargs = node.kwargs
    where = node.args[1] if len(node.args) > 1 else None
    for keyword in ("sections", "indices", "tensor_indices_or_sections"):
        where = kwargs.get(keyword, where)
    if isinstance(where, int):
        return "tensor_split"
    if isinstance(where, (list, tuple)) and all(isinstance(i, int) for i in where):
        return "tensor_split(indices)"
    return "tensor_split(tensor)"


#: casts, which from a float to an integer type are another op (``float_to_int``)
_CASTS = frozenset({"to", "type_as", "type", "long", "int", "short", "char", "byte"})
#: bitwise not, in its spellings
_INVERTS = frozenset({"bitwise_not", "invert", "__invert__"})
#: sums, by their names in a graph, whose 8-bit integer form is another op
_SUMS = {n: op for op in ("add", "sub") for n in (op, f"{op}_", f"i{op}", f"__{op}__")}
#: integer arithmetic OpenVINO keeps unless the graph bounds it within int32, by graph names
_INT32_ARITHMETIC = {n: op for op in ("mul", "neg", "abs") for n in (op, f"{op}_", f"__{op}__")} | {
    "sign": "sign",
    "imul": "mul",
    "cumsum": "cumsum",
    "clamp": "clamp",
    "sum": "sum",
}
#: comparisons, by their names in a graph
_COMPARES = {n: op for op in ("eq", "ne", "lt", "le", "gt", "ge") for n in (op, f"__{op}__")}
#: ops whose input has this rank with a batch axis; without one, they are another op
_BATCHED_RANK = {"avg_pool1d": 3, "avg_pool2d": 4, "unfold": 4, "fold": 3}
#: ops whose mode is another computation: name -> (position of ``mode``, its default)
_MODES = {"pad": (2, "constant"), "interpolate": (3, "nearest")}


def _touches_empty(node: fx.Node, name: str) -> bool:
    """Whether ``node`` reads or makes a tensor with a size of 0 (Dynamo specialises a size
    of 0, so a call with one builds a graph of its own, where the 0 is static)."""
    read = [a for a in node.all_input_nodes if a is not _ignored_input(node, name)]
    values = [node_value_meta(a) for a in read] + [node_value_meta(node)]
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is not None and any(isinstance(s, int) and s == 0 for s in shape):
            return True
    return False


def _ignored_input(node: fx.Node, name: str) -> object:
    """An argument ``node``'s op does not read, or None: ``multi_head_attention_forward``'s
    ``in_proj_weight`` with separate projection weights (WavLM passes ``torch.empty([0])``)."""
    if name == "multi_head_attention_forward" and _argument(
        node, 17, "use_separate_proj_weight", False
    ):
        return _argument(node, 5, "in_proj_weight", None)
    return None


def _integer_or_bool(dtype: torch.dtype | None) -> bool:
    return dtype == torch.bool or _integer(dtype)


def _integer(dtype: torch.dtype | None) -> bool:
    """Whether ``dtype`` is an integer type (bool is not)."""
    return (
        dtype is not None
        and not (dtype.is_floating_point or dtype.is_complex)
        and dtype != torch.bool
    )


def _result_dtype(node: fx.Node) -> torch.dtype | None:
    return getattr(node_value_meta(node), "dtype", None)


def _input_rank(node: fx.Node) -> int | None:
    """The rank of ``node``'s first tensor input (None: unknown)."""
    source = node.args[0] if node.args else None
    shape = getattr(node_value_meta(source), "shape", None) if isinstance(source, fx.Node) else None
    return len(shape) if shape is not None else None


def _empty_safe(node: fx.Node, name: str) -> bool:
    """Whether ``node`` only builds, joins or slices a tensor with a size of 0, as a decoder
    does with its empty cache on the first call (``torch.tensor([])`` built in the graph and
    joined by ``cat``; indexing by slices alone): the runtimes compute these; the process ends
    on other ops (an integer index into an empty tensor)."""
    if not node.all_input_nodes:
        return True  # built from constants and sizes alone
    if name == "cat":  # a (0,) tensor of another rank only where the graph builds it
        rank = len(getattr(node_value_meta(node), "shape", ()))
        return all(
            len(getattr(node_value_meta(a), "shape", ())) == rank or not a.all_input_nodes
            for a in node.all_input_nodes
        )
    if name != "getitem" or len(node.args) < 2:
        return False
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    return all(isinstance(i, slice) or i is None or i is Ellipsis for i in index)


def _argument(node: fx.Node, position: int, keyword: str, default: object) -> object:
    """An argument of ``node``'s call, given by position or keyword."""
    return node.args[position] if len(node.args) > position else node.kwargs.get(keyword, default)


def _float_to_int(node: fx.Node) -> bool:
    """Whether ``node`` turns a float tensor into an integer one (bool excluded)."""
    before, after = input_dtype(node), getattr(node_value_meta(node), "dtype", None)
    if before is None or not isinstance(after, torch.dtype):
        return False
    integer = not (after.is_floating_point or after.is_complex) and after != torch.bool
    return before.is_floating_point and integer


def _with_mode(node: fx.Node, name: str) -> str:
    """``pad`` and ``interpolate`` named by their mode (``pad`` alone: constant padding;
    ``interpolate(mode='bilinear')``; antialiasing is another op again)."""
    position, default = _MODES[name]
    mode = _argument(node, position, "mode", default)
    if name == "pad":
        return "pad" if mode == "constant" else f"pad(mode={mode!r})"
    antialias = _argument(node, 6, "antialias", False)
    return f"interpolate(mode={mode!r}" + (", antialias=True)" if antialias else ")")


def _pair(value: object) -> tuple[object, ...]:
    """An int-or-pair argument (``fold``'s padding) as a tuple."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _recurrent(node: fx.Node, name: str) -> str:
    """``lstm``, ``gru``, ``rnn_tanh`` or ``rnn_relu``, or the other op its arguments make it:
    a packed sequence (``torch.lstm(data, batch_sizes, hx, params, ...)``), an LSTM with
    ``proj_size`` (each layer and direction holds a fifth weight, or a third without biases),
    an input of another dtype than float32, another recurrent op beside it."""
    if len(node.args) < 9 or not isinstance(node.args[3], bool):
        return f"{name}(packed)"  # no row: Dynamo records none today
    params, layers, bidirectional = node.args[2], node.args[4], node.args[7]
    per_layer = len(params) // max(1, layers * (2 if bidirectional else 1))
    if name == "lstm" and per_layer in (3, 5):
        return "lstm(proj_size)"
    if input_dtype(node) not in (torch.float32, None):
        return f"{name}(not float32)"
    if _beside_another(node):
        return f"{name}(beside another)"
    return name


def _beside_another(node: fx.Node) -> bool:
    """Whether the graph holds another recurrent op that neither feeds ``node`` nor is fed by
    it, whose input is computed from one of the graph inputs ``node``'s input is computed
    from, and one of the two runs in one direction only. OpenVINO computes one of two such ops
    wrong where they read one input tensor, or two it merges into one (``relu(x)`` twice, ``x``
    and ``x + 0``); both bidirectional, one after the other, or on inputs of their own, it
    computes right."""
    others = [n for n in node.graph.nodes if n is not node and _is_recurrent(n)]
    if not others:
        return False
    before, roots = _ancestors(node), _graph_inputs(node.args[0])
    beside = [
        n
        for n in others
        if n not in before
        and node not in _ancestors(n)
        and (not roots or not _graph_inputs(n.args[0]) or roots & _graph_inputs(n.args[0]))
    ]
    return any(len(n.args) < 9 or n.args[7] is not True for n in (node, *beside)) and bool(beside)


def _graph_inputs(value: object) -> set[fx.Node]:
    """The graph inputs ``value`` is computed from (itself, if it is one)."""
    if not isinstance(value, fx.Node):
        return set()
    return {n for n in (value, *_ancestors(value)) if n.op == "placeholder"}


def _is_recurrent(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", None) in RECURRENT_OPS


def _ancestors(node: fx.Node) -> set[fx.Node]:
    """The nodes ``node``'s value is computed from."""
    found: set[fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        current = stack.pop()
        if current not in found:
            found.add(current)
            stack.extend(current.all_input_nodes)
    return found


def _plain_divisor(node: fx.Node) -> bool:
    """Whether the divisor is a Python number other than 0, -1 and the infinities."""
    divisor = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)):
        return False
    return divisor not in (0, -1) and math.isfinite(divisor)


def _max_norm(node: fx.Node) -> object:
    """``F.embedding``'s ``max_norm`` (its fourth argument)."""
    return node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")


def input_dtype(node: fx.Node) -> torch.dtype | None:
    """The dtype of ``node``'s first tensor input, in a list of them too (``einsum``'s
    operands, ``hstack``'s tensors); None: unknown."""
    for arg in (*node.args, *node.kwargs.values()):
        for item in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(item, fx.Node):
                dtype = getattr(node_value_meta(item), "dtype", None)
                if isinstance(dtype, torch.dtype):
                    return dtype
    return None
