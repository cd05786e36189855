"""PyTorch's semantics for the ops whose ONNX form a runtime computes differently, or that have
none.

Each function here computes exactly what the PyTorch op computes, in PyTorch, but out of ops
whose ONNX form every CPU runtime computes as PyTorch does; :func:`exact_lowering` puts them
in place of the originals in the graph that is exported (the table of which op needs what is
:mod:`embedl_dynamo.runtimes.conformance`):

* ``argmax``/``argmin``, ``max``/``min``/``amax``/``amin`` (and ``maximum``/``minimum``): in
  PyTorch a NaN is larger and smaller than every number, so a row holding one reduces to NaN
  and its arg-reduction to the first NaN's index; ONNX ``ArgMax``/``ReduceMax``/``Max`` skip
  it. Here ``IsNaN`` finds the rows that hold one and ``Where`` gives PyTorch's answer there.
* ``scaled_dot_product_attention`` with an additive float mask: a query whose every key the
  mask sets to ``-inf`` gets zeros in PyTorch; a softmax written out gives NaN. Here ``Where``
  gives the zeros.
* ``sum`` of integers: ONNX Runtime's ``ReduceSum`` accumulates int64 through a double, which
  rounds above 2**53; ``CumSum`` adds integers as integers, so the sum is the last running sum
  (a zero is padded in front, so an empty axis sums to 0).
* ``expand``/``expand_as`` of a 0-d tensor to rank 0 (a no-op): the exporter's form of it
  crashes OpenVINO's ``compile_model``; here it is the tensor itself.
* ``x[i, j]`` and ``x[i, j] = v`` with two or more index tensors: the exporter reads a negative
  index as a flat one; here each that can be negative is made non-negative first
  (:mod:`embedl_dynamo.graph.exact_index`).
* a binary op with a Python ``bool`` operand (``mask & True``, ``m <= True``): the exporter
  takes none; here the bool is the operand PyTorch computes the same result with
  (:mod:`embedl_dynamo.graph.bool_operands`).
* ``normalize`` of a 0-d tensor: the exporter reduces over axis 0 of a rank-0 tensor, which ONNX
  Runtime refuses; here the one element is normalized as a rank-1 tensor and reshaped back.
* ``rms_norm`` (``nn.RMSNorm``): no exporter takes it at the opset used; here it is PyTorch's
  own formula, ``x * rsqrt(mean(x**2) + eps) * weight`` (in float32 for a half input): its
  values bit for bit, in PyTorch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.bool_operands import bool_operand_form
from embedl_dynamo.graph.exact_index import index_form
from embedl_dynamo.graph.nodes import looked_up

__all__ = [
    "EXACT_FUNCTIONS",
    "exact_argmax",
    "exact_argmin",
    "exact_attention",
    "exact_log_softmax",
    "exact_lowering",
    "exact_max_pool2d",
    "exact_max",
    "exact_min",
    "exact_rms_norm",
    "exact_softmax",
    "exact_sum",
]


def _arg(reduce: Callable[..., torch.Tensor], x: torch.Tensor, dim: Any, keepdim: bool):
    if x.dim() == 0:  # ONNX's ArgMax takes no axis of a scalar: its only index is 0
        return torch.zeros_like(x, dtype=torch.int64)
    if not x.is_floating_point():
        return reduce(x, dim, keepdim)
    found = reduce(x, dim, keepdim)
    nan = torch.isnan(x)
    first_nan = torch.argmax(nan.to(x.dtype), dim, keepdim)
    return torch.where(nan.any() if dim is None else nan.any(dim, keepdim), first_nan, found)


def exact_argmax(input: torch.Tensor, dim: int | None = None, keepdim: bool = False):  # noqa: A002
    """``torch.argmax``: a NaN is the maximum (the first NaN's index), ties take the first."""
    return _arg(torch.argmax, input, dim, keepdim)


def exact_argmin(input: torch.Tensor, dim: int | None = None, keepdim: bool = False):  # noqa: A002
    """``torch.argmin``: a NaN is the minimum (the first NaN's index), ties take the first."""
    return _arg(torch.argmin, input, dim, keepdim)


def _values(reduce: Callable[..., torch.Tensor], x: torch.Tensor, dim: Any, keepdim: bool):
    """``amax``/``amin`` over ``dim`` (None or ``()``: all), NaN where the reduced part holds one."""
    whole = dim is None or dim == () or dim == []
    if x.dim() == 0:  # a scalar reduced over its "axis 0" is itself
        return x.clone()
    if whole:
        out = reduce(x, list(range(x.dim())), keepdim) if keepdim else reduce(x)
    else:
        out = reduce(x, dim, keepdim)
    if not x.is_floating_point():
        return out
    if whole:
        nan = torch.isnan(x).any()
    elif isinstance(dim, int):
        nan = torch.isnan(x).any(dim, keepdim)
    else:
        nan = torch.isnan(x).to(x.dtype).amax(dim, keepdim) > 0
    # OpenVINO's ReduceMax of -inf (ReduceMin of +inf) alone gives the dtype's finite limit
    limit = float("-inf") if reduce is torch.amax else float("inf")
    if whole:
        only = (x == limit).all()
    else:
        only = (x == limit).to(x.dtype).amin(dim, keepdim) > 0
    out = torch.where(only, torch.full_like(out, limit), out)
    return torch.where(nan, torch.full_like(out, float("nan")), out)


def _extreme(
    values: Callable[..., torch.Tensor],
    arg: Callable[..., torch.Tensor],
    binary: Callable[..., torch.Tensor],
    result: Any,
    args: tuple,
    kwargs: dict,
):
    bound = dict(zip(("input", "dim", "keepdim"), args), **kwargs)
    x = bound["input"]
    other = bound.get("other", bound.get("dim"))
    if isinstance(other, torch.Tensor):  # max(a, b): the elementwise maximum
        out = binary(x, other)
        if out.is_floating_point():
            out = torch.where(torch.isnan(x) | torch.isnan(other), float("nan"), out)
        return out
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    if dim is None:
        return _values(values, x, None, False)
    return result((_values(values, x, dim, keepdim), _arg(arg, x, dim, keepdim)))


def exact_max(*args: Any, **kwargs: Any) -> Any:
    """``torch.max`` in all its forms (whole tensor, over ``dim`` with indices, of two
    tensors) and ``amax``/``maximum``: NaN wins, as in PyTorch."""
    return _extreme(torch.amax, torch.argmax, torch.maximum, torch.return_types.max, args, kwargs)


def exact_min(*args: Any, **kwargs: Any) -> Any:
    """``torch.min`` in all its forms and ``amin``/``minimum``: NaN wins, as in PyTorch."""
    return _extreme(torch.amin, torch.argmin, torch.minimum, torch.return_types.min, args, kwargs)


def _amax(input: torch.Tensor, dim: Any = (), keepdim: bool = False):  # noqa: A002
    return _values(torch.amax, input, dim, keepdim)


def _amin(input: torch.Tensor, dim: Any = (), keepdim: bool = False):  # noqa: A002
    return _values(torch.amin, input, dim, keepdim)


def _maximum(input: torch.Tensor, other: torch.Tensor):  # noqa: A002
    return exact_max(input, other=other)


def _minimum(input: torch.Tensor, other: torch.Tensor):  # noqa: A002
    return exact_min(input, other=other)


def _sum_axis(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum over ``dim`` (kept, size 1) as the last running sum, after a zero."""
    dim = dim % x.dim()
    padded = F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [1, 0])
    return padded.cumsum(dim).narrow(dim, padded.shape[dim] - 1, 1)


def exact_sum(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.sum``: integers (and bools) added as int64 integers, floats as they are."""
    bound = dict(zip(("input", "dim", "keepdim"), args), **kwargs)
    x, dtype = bound["input"], bound.get("dtype")
    floating = (dtype or x.dtype).is_floating_point or (dtype or x.dtype).is_complex
    if x.dim() == 0:  # ONNX's ReduceSum takes no axis of a scalar: its sum is itself
        return x.to(dtype or (x.dtype if floating else torch.int64)).clone()
    if floating:
        return torch.sum(*args, **kwargs)
    x = x.to(dtype if dtype is not None else torch.int64)
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    if dim is None or dim == () or dim == []:
        flat = _sum_axis(x.reshape(1, -1), 1).reshape(())
        return flat.reshape([1] * x.dim()) if keepdim else flat
    dims = sorted({d % x.dim() for d in ([dim] if isinstance(dim, int) else dim)})
    for d in dims:
        x = _sum_axis(x, d)
    return x if keepdim else x.squeeze(dims) if dims else x


def exact_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``: a query whose every key an additive float mask
    sets to ``-inf`` gets zeros."""
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    if attn_mask is not None and attn_mask.is_floating_point():
        out = out.masked_fill(attn_mask.eq(float("-inf")).all(dim=-1, keepdim=True), 0.0)
    return out


def _nan_slices(x: torch.Tensor, out: torch.Tensor, dim: int | None) -> torch.Tensor:
    """``out`` with NaN throughout each slice along ``dim`` of ``x`` where PyTorch's softmax
    gives NaN (``dim`` None: the softmax's implicit axis, as PyTorch picks it)."""
    if dim is None:
        dim = 0 if x.dim() in (0, 1, 3) else 1
    # PyTorch subtracts the slice's max: a NaN or +inf in it, or -inf throughout, gives NaN
    bad = (torch.isnan(x) | (x == float("inf"))).any(dim, keepdim=True)
    bad = bad | (x == float("-inf")).all(dim, keepdim=True)
    return out.masked_fill(bad, float("nan"))


def _softmax_method(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None):  # noqa: A002
    return exact_softmax(input, dim, dtype=dtype)


def _log_softmax_method(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None):  # noqa: A002
    return exact_log_softmax(input, dim, dtype=dtype)


def exact_softmax(
    input: torch.Tensor,  # noqa: A002
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.softmax``: a slice holding a NaN is NaN throughout, as in PyTorch (OpenVINO's
    Softmax gives 0 at its other positions)."""
    if input.dim() == 0:  # ONNX's Softmax takes no scalar: as a 1-element vector
        return exact_softmax(input.reshape(1), 0, dtype=dtype).reshape(())
    out = F.softmax(input, dim, _stacklevel, dtype)
    return _nan_slices(input, out, dim)


def exact_log_softmax(
    input: torch.Tensor,  # noqa: A002
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.log_softmax``: a slice holding a NaN is NaN throughout, as in PyTorch."""
    if input.dim() == 0:  # ONNX's LogSoftmax takes no scalar: as a 1-element vector
        return exact_log_softmax(input.reshape(1), 0, dtype=dtype).reshape(())
    out = F.log_softmax(input, dim, _stacklevel, dtype)
    return _nan_slices(input, out, dim)


def exact_max_pool2d(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
    """``F.max_pool2d``: a window holding a NaN gives NaN, as in PyTorch (ONNX's MaxPool
    skips it on both runtimes): the same pooling of the NaN mask marks those windows. With
    ``return_indices`` the indices of such a window are the runtime's
    (:mod:`embedl_dynamo.runtimes.conformance` lists it)."""
    out = F.max_pool2d(input, *args, **kwargs)
    if not input.is_floating_point():
        return out
    mask = F.max_pool2d(torch.isnan(input).to(input.dtype), *args, **kwargs)
    if isinstance(out, tuple):  # the values; the indices stay the runtime's
        return out[0].masked_fill(mask[0] > 0, float("nan")), out[1]
    return out.masked_fill(mask > 0, float("nan"))


def exact_rms_norm(
    input: torch.Tensor,  # noqa: A002
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``F.rms_norm`` as PyTorch computes it: over the last ``len(normalized_shape)`` axes, a
    half input and the weight in float32, the result in the input's dtype; ``eps`` the
    machine epsilon of the dtype computed in when None."""
    x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = list(range(-len(normalized_shape), 0))
    out = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.to(x.dtype)
    return out.to(input.dtype)


def _flat_sizes(sizes: tuple[Any, ...]) -> list[Any]:
    return [d for s in sizes for d in (s if isinstance(s, (tuple, list, torch.Size)) else (s,))]


def _expand_method(x: torch.Tensor, *sizes: Any) -> torch.Tensor:
    """``x.expand(*sizes)``; a 0-d ``x`` expanded to rank 0 (a no-op) is ``x``: the exporter
    writes that no-op as an ``Expand`` to the shape of an empty ``ConstantOfShape``, on which
    OpenVINO's ``compile_model`` crashes the process."""
    if x.dim() == 0 and not _flat_sizes(sizes):
        return x
    return x.expand(*sizes)


def _expand_as_method(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``x.expand_as(other)``; a 0-d ``other`` (so a 0-d ``x``) gives ``x``, as above."""
    return x if other.dim() == 0 and x.dim() == 0 else x.expand_as(other)


def _normalize(
    input: torch.Tensor, p: float = 2.0, dim: Any = 1, eps: float = 1e-12, out: Any = None
) -> torch.Tensor:
    """``F.normalize``; a 0-d ``input`` is normalized as the one element of a rank-1 tensor and
    given back 0-d (the same arithmetic on the same element): the exporter's norm of a 0-d
    tensor reduces over its axis 0, which ONNX Runtime refuses (a rank-0 tensor has no axis)."""
    if input.dim() == 0 and out is None:
        return F.normalize(input.reshape(1), p, 0, eps).reshape(())
    return F.normalize(input, p, dim, eps, out)


#: the torch function or Tensor method -> its exact form
EXACT_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    torch.argmax: exact_argmax,
    torch.argmin: exact_argmin,
    torch.max: exact_max,
    torch.min: exact_min,
    torch.amax: _amax,
    torch.amin: _amin,
    torch.maximum: _maximum,
    torch.minimum: _minimum,
    torch.sum: exact_sum,
    F.scaled_dot_product_attention: exact_attention,
    F.softmax: exact_softmax,
    torch.softmax: _softmax_method,
    F.log_softmax: exact_log_softmax,
    torch.log_softmax: _log_softmax_method,
    F.max_pool2d: exact_max_pool2d,
    torch.max_pool2d: exact_max_pool2d,
    F.rms_norm: exact_rms_norm,
    F.normalize: _normalize,
    torch.rms_norm: exact_rms_norm,
    "softmax": _softmax_method,
    "log_softmax": _log_softmax_method,
    "argmax": exact_argmax,
    "argmin": exact_argmin,
    "max": exact_max,
    "min": exact_min,
    "amax": _amax,
    "amin": _amin,
    "maximum": _maximum,
    "minimum": _minimum,
    "sum": exact_sum,
    "expand": _expand_method,
    "expand_as": _expand_as_method,
}


def exact_lowering(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` (sharing its weights) in which each op of :data:`EXACT_FUNCTIONS`, and
    each indexing with several index tensors (:func:`~.exact_index.index_form`), is its exact
    form; ``gm`` itself when it holds none. The copy computes the same values in PyTorch; its
    ONNX export computes them on every runtime."""
    if not isinstance(gm, fx.GraphModule):
        return gm  # a module exported as it is: no graph to rewrite
    if not any(_exact(gm, node) is not None for node in gm.graph.nodes):
        return gm
    copy = fx.GraphModule(gm, _copied_graph(gm.graph), gm.__class__.__name__)
    copy.meta.update(gm.meta)
    for node in copy.graph.nodes:
        form = _exact(copy, node)
        if form is not None:
            node.op, node.target = "call_function", form[0]
            node.kwargs = {**node.kwargs, **form[1]}
    copy.recompile()
    return copy


def _copied_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    output = new.graph_copy(graph, {})
    new.output(output)
    return new


def _exact(gm: fx.GraphModule, node: fx.Node) -> tuple[Callable[..., Any], dict] | None:
    """The exact form of ``node`` and the keyword arguments to add, or None."""
    if node.target in (operator.getitem, operator.setitem):
        return index_form(gm, node)
    if node.op not in ("call_function", "call_method"):
        return None
    form = bool_operand_form(node)
    if form is not None:
        return form
    target = looked_up(EXACT_FUNCTIONS, node.target)
    return (target, {}) if target is not None else None
