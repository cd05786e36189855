"""The half type a runtime computes a graph's *unquantized* layers in (``mixed``'s third choice).

An INT8 graph leaves its unquantized layers in float. A runtime that computes faster in a
half type (OpenVINO's CPU plugin in ``bf16`` on a CPU with AVX512_BF16 or AMX) can run them in
it instead, keeping its own precision-sensitive ops (norms, reductions, softmax) in f32: INT8
where a layer pays, the half type elsewhere, as TensorRT's INT8 + FP16 and NNCF + OpenVINO's
default do. The choice is a fact of the graph, so it travels with it:

* ``gm.meta[REST_PRECISION_META]``: set by :func:`with_rest_precision`, part of the graph's
  fingerprint (so its artifact is keyed apart from the same graph without it);
* the ONNX file's ``metadata_props[ONNX_REST_PRECISION]``: written by the exporter, read by
  the runtime that compiles the file (OpenVINO's ``INFERENCE_PRECISION_HINT``); a runtime that
  cannot compute in it runs the float layers in f32, as the file's types say.
"""

from __future__ import annotations

from torch import fx, nn

__all__ = ["ONNX_REST_PRECISION", "REST_PRECISION_META", "rest_precision", "with_rest_precision"]

REST_PRECISION_META = "embedl_rest_precision"
ONNX_REST_PRECISION = "embedl_dynamo.rest_precision"
_NAMES = ("bf16", "fp16")


def rest_precision(gm: fx.GraphModule | nn.Module) -> str | None:
    """The half type ``gm``'s unquantized layers run in (``bf16``/``fp16``); None: as typed
    (and for a module that is not a graph module)."""
    return getattr(gm, "meta", {}).get(REST_PRECISION_META)


def with_rest_precision(gm: fx.GraphModule, name: str) -> fx.GraphModule:
    """A graph module computing like ``gm`` whose unquantized layers run in ``name``
    (``bf16``/``fp16``). It shares ``gm``'s submodules and weights (nothing is copied) and has
    a graph of its own; ``gm`` is not modified.

    Raises:
        ValueError: ``name`` is not a half type.
    """
    if name not in _NAMES:
        raise ValueError(f"rest precision {name!r} is not a half type; use one of {_NAMES}")
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    marked = fx.GraphModule(gm, graph, gm.__class__.__name__)
    marked.meta = {**gm.meta, REST_PRECISION_META: name}
    return marked
