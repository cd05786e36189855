"""Hooks into the TorchScript exporter's passes (process-wide state, so taken under one lock).

* :func:`capture_initializers` records the exporter's final name -> tensor map of initializers
  (the return value of its de-duplication pass), for :mod:`~.initializers` to attach them;
* :func:`replaced_passes` wraps any of its passes (:mod:`~.initializer_sources` records what
  its folding computes each initializer from);
* :func:`shape_inference_without_weights` gives its whole-graph shape inference only the
  parameters whose values can decide a shape.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "SHAPE_VALUE_MAX_ELEMENTS",
    "capture_initializers",
    "replaced_passes",
    "shape_inference_without_weights",
]

_PASS = "_jit_pass_onnx_deduplicate_initializers"
_SHAPE_PASS = "_jit_pass_onnx_graph_shape_type_inference"
# ONNX shape inference reads values only from the inputs that are shapes, indices, axes or
# scales (Reshape, Expand, Slice, Tile, Resize...): integer tensors, or a few floats
SHAPE_VALUE_MAX_ELEMENTS = 64
_LOCK = threading.RLock()  # the exporter's state (and these hooks) is process-wide


@contextlib.contextmanager
def capture_initializers() -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, record every initializer the TorchScript exporter settles on.

    Yields:
        A dict filled, once ``torch.onnx.export`` returns, with the exporter's final
        initializer names and tensors (empty if this torch has no such pass).
    """
    captured: dict[str, torch.Tensor] = {}
    original = getattr(torch._C, _PASS, None)
    if original is None:
        yield captured
        return

    def record(graph: Any, params: dict[str, Any], *rest: Any) -> dict[str, Any]:
        result = original(graph, params, *rest)
        captured.clear()
        captured.update(result)
        return result

    with _LOCK:
        setattr(torch._C, _PASS, record)
        try:
            yield captured
        finally:
            setattr(torch._C, _PASS, original)


def _may_decide_a_shape(value: Any) -> bool:
    if not isinstance(value, torch.Tensor):
        return True
    return not value.is_floating_point() or value.numel() <= SHAPE_VALUE_MAX_ELEMENTS


@contextlib.contextmanager
def shape_inference_without_weights() -> Iterator[None]:
    """Within the block, the exporter's shape inference sees no floating-point weight values.

    Its parameters dict is filtered to integer tensors and floats of at most
    :data:`SHAPE_VALUE_MAX_ELEMENTS` elements; a weight stays a typed graph value with its
    full shape, so every inferred type and shape is unchanged.
    """
    original = getattr(torch._C, _SHAPE_PASS, None)
    if original is None:
        yield
        return

    def infer(graph: Any, params: dict[str, Any], *rest: Any) -> Any:
        small = {name: v for name, v in params.items() if _may_decide_a_shape(v)}
        return original(graph, small, *rest)

    with _LOCK:
        setattr(torch._C, _SHAPE_PASS, infer)
        try:
            yield
        finally:
            setattr(torch._C, _SHAPE_PASS, original)


@contextlib.contextmanager
def replaced_passes(wrappers: Mapping[str, Callable[[Any], Any]]) -> Iterator[None]:
    """Within the block, each exporter pass named in ``wrappers`` (``torch._C``'s name) is
    ``wrappers[name](the pass)``; a pass this torch lacks is left out.

    Example:
        >>> with replaced_passes({"_jit_pass_onnx_constant_fold": lambda original: original}):
        ...     pass  # torch.onnx.export(..., dynamo=False)
    """
    with _LOCK:
        originals = {name: getattr(torch._C, name, None) for name in wrappers}
        try:
            for name, wrap in wrappers.items():
                if originals[name] is not None:
                    setattr(torch._C, name, wrap(originals[name]))
            yield
        finally:
            for name, original in originals.items():
                if original is not None:
                    setattr(torch._C, name, original)
