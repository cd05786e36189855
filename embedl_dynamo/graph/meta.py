"""Shape metadata for nodes a rewrite creates, computed on the ``meta`` device.

Conversions run to a fixpoint, and a later conversion may need the shape of a node an earlier
one created (``decompose_mha`` reads the query shape of the attention that
``decompose_transformer_encoder_layer`` built). :func:`infer_meta` runs a new node's target on
``meta`` tensors of the same shapes and dtypes (no data, no compute), or on Dynamo's fake
tensors in their own mode when the inputs have them (symbolic batch sizes survive), and stores
the result in ``node.meta["val"]``, where :func:`~embedl_dynamo.graph.nodes.node_shape` finds it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_leaves

from embedl_dynamo.graph.nodes import constant_value, node_value_meta

__all__ = ["infer_meta", "set_meta_shape"]

logger = logging.getLogger(__name__)


class _Unknown(Exception):
    """An input whose shape is not known statically."""


def _as_meta(value: Any) -> Any:
    if value is None:  # e.g. the attention weights attention returns when not asked for
        return None
    if isinstance(value, torch.Tensor):
        return value  # a fake tensor (Dynamo's example value, symbolic sizes kept) or meta
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:  # ShapeProp's TensorMetadata is a tuple with a shape
        if isinstance(value, (tuple, list)):
            return tuple(_as_meta(v) for v in value)
        raise _Unknown
    if not all(isinstance(s, int) for s in shape):
        raise _Unknown
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _input(gm: fx.GraphModule, value: Any) -> Any:
    if isinstance(value, fx.Node):
        if value.op == "get_attr":
            tensor = constant_value(gm, value)
            if isinstance(tensor, torch.Tensor):
                return _Constant(tensor)
        meta = node_value_meta(value)
        if meta is None:
            raise _Unknown
        return _as_meta(meta)
    if isinstance(value, (tuple, list)):
        return type(value)(_input(gm, v) for v in value)
    return value


class _Constant:
    """A real constant, converted once the mode of the other inputs (fake or meta) is known."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _finish(value: Any, fake_mode: Any) -> Any:
    if isinstance(value, _Constant):
        if fake_mode is not None:
            return fake_mode.from_tensor(value.tensor, static_shapes=True)
        return torch.empty(value.tensor.shape, dtype=value.tensor.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_finish(v, fake_mode) for v in value)
    if isinstance(value, dict):
        return {k: _finish(v, fake_mode) for k, v in value.items()}
    return value


def _fake_mode_of(values: Any) -> Any:
    """The fake mode of the fake tensors among ``values`` (None: there are none).

    Taken from the tensors themselves, not from the tracing context around the call (which
    ``torch._guards.detect_fake_mode`` asks first): a compile under ``dynamic=True`` runs our
    rewrites inside a Dynamo context whose mode is not the one of the graph's example values,
    and mixing the two fails. Tensors of two modes: the shape is unknown."""
    modes = {id(t.fake_mode): t.fake_mode for t in tree_leaves(values) if isinstance(t, FakeTensor)}
    if len(modes) > 1:
        raise _Unknown
    return next(iter(modes.values()), None)


def infer_meta(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> None:
    """Set ``meta["val"]`` of ``nodes`` (in graph order) from their inputs' shapes.

    Args:
        gm: the graph module the nodes belong to (for constants).
        nodes: ``call_function`` / ``call_method`` nodes; others, and nodes whose inputs have
            unknown shapes (or symbolic ones outside a fake mode), are skipped and keep no shape.
    """
    for node in nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        try:
            args = _input(gm, node.args)
            kwargs = {k: _input(gm, v) for k, v in node.kwargs.items()}
            fake_mode = _fake_mode_of((args, kwargs))
            args, kwargs = _finish(args, fake_mode), _finish(kwargs, fake_mode)
            with torch.no_grad(), fake_mode if fake_mode is not None else nullcontext():
                if node.op == "call_method":
                    value = getattr(args[0], str(node.target))(*args[1:], **kwargs)
                else:
                    value = node.target(*args, **kwargs)
        except _Unknown:
            continue
        except Exception as error:  # an op without a meta kernel: the shape stays unknown
            logger.debug("no meta shape for %s: %s", node.name, error)
            continue
        node.meta.pop("tensor_meta", None)
        node.meta.pop("example_value", None)
        node.meta["val"] = value


def set_meta_shape(node: fx.Node, like: fx.Node, shape: Iterable[Any]) -> None:
    """Set ``meta["val"]`` of ``node`` to an empty tensor of ``shape`` with the dtype of
    ``like``'s value, in its fake mode where it has one (symbolic sizes stay symbolic).

    For a rewrite that knows its new node's shape: running the op on fake tensors instead
    (:func:`infer_meta`) decomposes ops such as ``repeat_interleave`` into several fake ops,
    each slow where the sizes are symbolic. An unknown ``like`` leaves ``node`` without one.
    """
    try:
        value = _as_meta(node_value_meta(like))
    except _Unknown:
        return
    if not isinstance(value, torch.Tensor):
        return
    node.meta.pop("tensor_meta", None)
    node.meta.pop("example_value", None)
    node.meta["val"] = value.new_empty(tuple(shape))
