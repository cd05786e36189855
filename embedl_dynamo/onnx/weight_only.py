"""Store weight-only layers' weights as integers: ``DequantizeLinear(q, s, z) -> MatMul``.

A :class:`~embedl_dynamo.quant.weight_only.linear.WeightOnlyLinear` exports as ``MatMul(x, W'.T)``
with ``W'`` as a float constant (held only while it is exported, :func:`with_dense_weights`);
here that constant is replaced by its integer codes read by ``DequantizeLinear``, the one
portable form every runtime takes with its own kernels:

* 8 bits: int8 (symmetric) or uint8 codes ``[K, N]``, a scale (and zero point) per output
  channel (``axis=1``), any opset from 13;
* 4 bits: int4 / uint4 codes ``[K, N]`` (two per byte, low nibble first), a scale (and zero
  point) per block of ``block_size`` rows along ``K`` (``axis=0``): blocked quantization, so
  the model is converted to opset 21 (onnx's version converter) and IR version 10.

ONNX Runtime's level-2 optimiser fuses ``DequantizeLinear -> MatMul`` on a constant into
``com.microsoft::MatMulNBits`` (``accuracy_level`` from the session option
``session.qdq_matmulnbits_accuracy_level``); OpenVINO's CPU plugin runs the same pattern as a
compressed-weight ``FullyConnected``; TensorRT reads it as weight-only quantization. The values
are those ``WeightOnlyLinear`` computed with in PyTorch: ``(q - z) * s``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from embedl_dynamo.cache.hashed_file import open_hashed
from embedl_dynamo.cache.keys import tensor_bytes
from embedl_dynamo.onnx import external_data
from embedl_dynamo.onnx.initializers import UnwrittenOnnx, unwritten_float_model
from embedl_dynamo.quant.weight_only.linear import WeightOnlyLinear, dense_weights

__all__ = [
    "BLOCKED_OPSET",
    "save_weight_only",
    "store_weight_only",
    "weight_only_layers",
    "with_dense_weights",
]

BLOCKED_OPSET = 21  # the first opset whose DequantizeLinear takes int4 and block_size


def weight_only_layers(gm: fx.GraphModule) -> list[WeightOnlyLinear]:
    """The weight-only layers of ``gm`` (none: an ordinary graph)."""
    return [m for m in gm.modules() if isinstance(m, WeightOnlyLinear)]


def save_weight_only(
    exported: tuple[Any, dict[str, torch.Tensor]] | None,
    path: Path,
    layers: list[WeightOnlyLinear],
    write: bool = True,
) -> tuple[int, UnwrittenOnnx | None]:
    """Write the exported model with ``layers``' weights stored as integers, checked.

    From the TorchScript exporter's ``(model, weights)`` the float weights a layer replaces
    are never turned into protobuf: matching happens on the exporter's tensors, the graph is
    checked without its weights, and the file is written from the tensors' memory
    (:meth:`~.initializers.UnwrittenOnnx.write`, a data file beside it when large). So the
    float model, its serialised copy and the integer one are never all in memory at once.

    Args:
        exported: the TorchScript exporter's ``(model, weights)``, or None when the exporter
            wrote ``path`` itself (read back here).
        path: the ``.onnx`` file.
        layers: :func:`weight_only_layers` of the exported graph.
        write: False: the checked model from ``exported`` is returned unwritten, for the
            caller to write to ``path`` (and run from memory meanwhile), as a float graph is.

    Returns:
        The number of weights stored as integers, and the unwritten model (None once written).
    """
    import onnx

    if exported is not None:
        stored, unwritten = _save_from_tensors(*exported, layers)
        if write:
            unwritten.write(path)
            unwritten = None
        return stored, unwritten
    model = onnx.load(str(path))
    stored = store_weight_only(model, layers)
    if external_data.initializer_bytes(model) > external_data.EXTERNAL_DATA_BYTES:
        external_data.save_model_file(model, path)
        return stored
    data = model.SerializeToString()
    onnx.checker.check_model(data)
    with open_hashed(path) as f:
        f.write(data)
    return stored, None


def _save_from_tensors(
    model: Any, weights: dict[str, torch.Tensor], layers: list[WeightOnlyLinear]
) -> tuple[int, UnwrittenOnnx]:
    """:func:`save_weight_only`, unwritten, for a model whose weights are still graph inputs,
    valued by the exporter's ``weights``; 8-bit codes stay tensors, 4-bit ones are packed
    protos."""
    import onnx

    if any(layer.spec.bits == 4 for layer in layers):
        _to_blocked_opset(model)  # on the graph alone: the weights are inputs still
    graph, kept = model.graph, dict(weights)

    def weight_of(name: str) -> tuple[tuple[int, ...], Any, Any] | None:
        weight = weights.get(name)
        if weight is None:
            return None
        return tuple(weight.shape), lambda: tensor_bytes(weight), weight

    stored, replaced = _replace_matmul_weights(graph, layers, weight_of, kept)
    still_read = {name for node in graph.node for name in node.input}
    for name in replaced - still_read:
        del kept[name]
    inputs = [i for i in graph.input if i.name not in replaced or i.name in still_read]
    del graph.input[:]
    graph.input.extend(inputs)
    graph.input.extend(
        onnx.helper.make_tensor_value_info(n, _onnx_type(t), list(t.shape))
        for n, t in kept.items()
        if n not in weights
    )  # the codes, as inputs while the graph is checked
    _raise_ir_version(model, stored, layers)
    unwritten = unwritten_float_model(model, kept)
    if unwritten is None:
        raise ValueError("a weight-only graph holds QuantizeLinear nodes: not supported")
    return stored, unwritten


def _onnx_type(tensor: torch.Tensor) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=tensor.dtype).numpy().dtype)


def _digest(data: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(data), digest_size=16).digest()


class _LayerIndex:
    """The weight-only layers by their ``W'.T``: by the memory of the tensor a layer holds
    (the very tensor the exporter was given, so no byte needs reading), else by shape and a
    digest of the bytes (tied layers: the first), computed only when first needed. A layer
    without its ``weight_t`` buffer (outside :func:`with_dense_weights`) dequantizes it then,
    one layer at a time."""

    def __init__(self, layers: list[WeightOnlyLinear]) -> None:
        self.layers = layers
        self.shapes = {tuple(layer.codes.shape[::-1]) for layer in layers}  # W'.T: [K, N]
        self.by_memory = {}
        for layer in layers:
            held = layer._buffers.get("weight_t")
            if held is not None:
                self.by_memory.setdefault(_memory(held), layer)
        self._by_digest: dict[tuple[tuple[int, ...], bytes], WeightOnlyLinear] | None = None

    def find(self, shape: tuple[int, ...], data: Callable[[], Any], tensor: Any) -> Any:
        """The layer whose ``W'.T`` is this weight (``tensor`` when the exporter's weight is a
        tensor, else None), or None."""
        if shape not in self.shapes:
            return None
        if tensor is not None and (layer := self.by_memory.get(_memory(tensor))) is not None:
            return layer
        if self._by_digest is None:
            self._by_digest = {}
            for layer in self.layers:
                weight = layer.dense_weight_t().detach()
                key = (tuple(weight.shape), _digest(tensor_bytes(weight)))
                self._by_digest.setdefault(key, layer)
                del weight
        return self._by_digest.get((shape, _digest(data())))


def _memory(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Where a tensor's bytes are and how they are laid out: equal keys, equal bytes."""
    return (tensor.device, tensor.dtype, tensor.data_ptr(), tuple(tensor.shape), tensor.stride())


def with_dense_weights(export: Callable[..., Any]) -> Callable[..., Any]:
    """``export(gm, ...)`` with ``gm``'s weight-only layers holding their float ``W'.T``
    (:func:`~embedl_dynamo.quant.weight_only.linear.dense_weights`) for the exporter, and only while
    it runs: the float weights never outlive the export."""

    @functools.wraps(export)
    def exporting(gm: Any, *args: Any, **kwargs: Any) -> Any:
        with dense_weights(gm):
            return export(gm, *args, **kwargs)

    return exporting


def store_weight_only(model: Any, layers: list[WeightOnlyLinear]) -> int:
    """Replace each ``MatMul`` constant equal to a layer's ``W'.T`` by its integer form.

    A constant is matched by a digest of its bytes (the exporter names initializers its own
    way), so tied layers share one match. The model is converted to opset 21 first if a layer
    has 4 bits.

    Args:
        model: an ``onnx.ModelProto`` with its initializers; changed in place.
        layers: the weight-only layers whose ``W'.T`` the graph multiplies by.

    Returns:
        The number of ``MatMul`` weights replaced.
    """
    if any(layer.spec.bits == 4 for layer in layers):
        _to_blocked_opset(model)
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}

    def weight_of(name: str) -> tuple[tuple[int, ...], Any, Any] | None:
        weight = initializers.get(name)
        if weight is None:
            return None
        return tuple(weight.dims), lambda: np.frombuffer(_raw(weight), np.uint8), None

    stored, replaced = _replace_matmul_weights(graph, layers, weight_of)
    still_read = {name for node in graph.node for name in node.input}
    keep = [i for i in graph.initializer if i.name not in replaced or i.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    _raise_ir_version(model, stored, layers)
    return stored


def _replace_matmul_weights(
    graph: Any,
    layers: list[WeightOnlyLinear],
    weight_of: Callable[[str], tuple[tuple[int, ...], Callable[[], Any], Any] | None],
    tensors: dict[str, Any] | None = None,
) -> tuple[int, set[str]]:
    """Read each ``MatMul`` weight that equals a layer's ``W'.T`` (the same tensor, or the
    same shape and digest of its bytes) through the layer's DequantizeLinear instead.
    ``weight_of(name)`` gives a weight's shape, a function for its bytes and the tensor itself
    where there is one (None: not a constant); the bytes are read only for weights of a layer's
    shape that are not the layer's own tensor. Returns how many were replaced, and their
    names."""
    index = _LayerIndex(layers)
    stored, replaced, nodes = 0, set(), []
    for node in graph.node:
        name = node.input[1] if node.op_type == "MatMul" and len(node.input) > 1 else ""
        found = weight_of(name) if name else None
        layer = index.find(*found) if found is not None else None
        if layer is not None:
            dq = _dequantize_node(graph, layer, f"{name}_woq{stored}", tensors)
            nodes.append(dq)
            replaced.add(name)
            node.input[1] = dq.output[0]
            stored += 1
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return stored, replaced


def _raise_ir_version(model: Any, stored: int, layers: list[WeightOnlyLinear]) -> None:
    """Blocked int4 DequantizeLinear needs IR version 10 (onnx's 2024-03-25)."""
    import onnx

    if stored and any(layer.spec.bits == 4 for layer in layers):
        model.ir_version = max(model.ir_version, onnx.IR_VERSION_2024_3_25)


def _raw(tensor: Any) -> bytes:
    from onnx import numpy_helper

    return tensor.raw_data if tensor.raw_data else numpy_helper.to_array(tensor).tobytes()


def _to_blocked_opset(model: Any) -> None:
    """Convert ``model`` (in place) to :data:`BLOCKED_OPSET` if it imports an older one."""
    import onnx
    from onnx import version_converter

    default = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if default is None or default.version >= BLOCKED_OPSET:
        return
    try:
        converted = version_converter.convert_version(model, BLOCKED_OPSET)
    except Exception as exc:  # the converter raises bare RuntimeErrors per op
        raise ValueError(
            f"int4 weights need opset {BLOCKED_OPSET} (blocked DequantizeLinear) and onnx's "
            f"version converter cannot convert this model from opset {default.version}: {exc}. "
            "Use int8_weight_only for this model."
        ) from exc
    model.CopyFrom(converted)
    model.ir_version = max(model.ir_version, onnx.IR_VERSION_2024_3_25)


def _dequantize_node(
    graph: Any, layer: WeightOnlyLinear, prefix: str, tensors: dict[str, Any] | None = None
) -> Any:
    """Add ``layer``'s codes, scale and zero point as initializers; their DequantizeLinear.

    With ``tensors``, 8-bit codes go there as a tensor (written later from its memory)
    instead of into ``graph``."""
    from onnx import TensorProto, helper, numpy_helper

    spec = layer.spec
    codes_t = layer.codes.t().contiguous()  # [K, N]
    codes = codes_t.numpy()
    scale = layer.scale.t().contiguous().numpy().astype(np.float32)  # [K / group, N]
    zero = None if layer.zero_point is None else layer.zero_point.t().contiguous().numpy()
    if spec.bits == 8:
        scale = scale.reshape(-1)
        zero = None if zero is None else zero.reshape(-1)
        attrs: dict[str, int] = {"axis": 1}
        if tensors is not None:
            tensors[f"{prefix}_q"] = codes_t
        else:
            graph.initializer.append(numpy_helper.from_array(codes, f"{prefix}_q"))
        if zero is not None:
            graph.initializer.append(numpy_helper.from_array(zero, f"{prefix}_z"))
    else:
        kind = TensorProto.INT4 if spec.symmetric else TensorProto.UINT4
        attrs = {"axis": 0, "block_size": spec.group_size}
        graph.initializer.append(_packed_int4(f"{prefix}_q", codes, kind))
        if zero is not None:
            graph.initializer.append(_packed_int4(f"{prefix}_z", zero, TensorProto.UINT4))
    graph.initializer.append(numpy_helper.from_array(scale, f"{prefix}_s"))
    inputs = [f"{prefix}_q", f"{prefix}_s"] + ([f"{prefix}_z"] if zero is not None else [])
    return helper.make_node("DequantizeLinear", inputs, [f"{prefix}_w"], name=prefix, **attrs)


def _packed_int4(name: str, values: np.ndarray, kind: int) -> Any:
    """A 4-bit ``TensorProto``: two values per byte, the first in the low nibble."""
    from onnx import TensorProto

    if values.dtype.itemsize != 1:  # the pairs below are read byte by byte
        raise ValueError(f"int4 codes must be int8 or uint8, not {values.dtype}")
    flat = np.ascontiguousarray(values).reshape(-1).view(np.uint8)  # int4 codes: low nibble
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    # each pair of bytes read as one little-endian uint16 (first value in its low byte): no
    # strided access to the pairs; the byte-wide results are combined in place
    pairs = flat.view("<u2")
    packed = (pairs & 0x0F).astype(np.uint8)
    high = (pairs >> 8).astype(np.uint8)
    high <<= 4
    packed |= high
    proto = TensorProto(name=name, data_type=kind, dims=list(values.shape))
    proto.raw_data = packed.tobytes()
    return proto
