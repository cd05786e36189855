"""Weights for the TorchScript exporter's graph, added in Python instead of serialised in C++.

Why: torch 2.13's ``graph._export_onnx`` copies every weight into the protobuf it returns, and
the file is then written, read back and checked; for a large model these copies and the second
read are a large share of a cold compile. Exported with ``export_params=False`` the
graph is the same (constant folding, BatchNorm folding and initializer de-duplication run on
the parameters either way; ``export_params`` only decides whether ``_export_onnx`` writes them),
but every weight is left as a graph input with no value.
:func:`~.exporter_hooks.capture_initializers` records the exporter's final name -> tensor map as
it computes it (the return value of its de-duplication pass, the last pass before
serialisation), and :func:`attach_initializers` turns
those inputs back into initializers with one copy per tensor. The result equals the
``export_params=True`` file node for node and byte for byte in every weight (tested).

If the pass is not reached (another torch version) or a value cannot be written, nothing is
guessed: :func:`attach_initializers` returns False and the caller exports with
``export_params=True`` as before.

The exporter's whole-graph shape inference is given only the parameters whose values can
decide a shape (:func:`~.exporter_hooks.shape_inference_without_weights`): given all of them,
it builds single-node ONNX models that carry every weight as a constant, to learn shapes the
weights' types already state. The exported graph is the same (tested).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.cache.hashed_file import open_hashed
from embedl_dynamo.cache.keys import tensor_bytes, version_of
from embedl_dynamo.errors import WeightsChangedWhileWritingError
from embedl_dynamo.onnx import external_data
from embedl_dynamo.onnx.external_data import data_path, save_model_file
from embedl_dynamo.onnx.fp8_weights import fold_fp8_weights
from embedl_dynamo.onnx.int8_weights import fold_int8_weights
from embedl_dynamo.onnx.transposed_weights import read_transposed, transposed_weights

__all__ = [
    "attach_initializers",
    "graph_weights",
    "OrtInitializers",
    "save_quantized",
    "SHARED_LOCATION",
    "SHARED_MIN_BYTES",
    "tensor_proto",
    "UnwrittenOnnx",
    "unwritten_float_model",
]

_ALIGN = 4096  # each weight in a data file starts at a multiple of this (mappable as is)
# the external-data location of the weights ONNX Runtime is handed by reference (an empty file of
# this name stands in for them: ONNX Runtime checks it exists, and reads nothing from it)
SHARED_LOCATION = "embedl-shared-initializers"
SHARED_MIN_BYTES = 1 << 20  # smaller weights (shapes, norms) are copied: they cost nothing
# convolution weights are copied, never shared: ONNX Runtime's NCHWc layout pass reorders them
# from the initializer's file before a shared one replaces it, and fails on the empty stand-in
_REORDERED_WEIGHTS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})


def _folded_weights(model: Any, weights: Iterable[str]) -> set[str]:
    """The ``weights`` read by a node whose every input is constant (a weight, an initializer,
    a ``Constant`` or such a node's output): ONNX Runtime's constant folding computes it from
    the initializer's file before a shared one replaces it, and fails on the empty stand-in
    (BERT's position-embedding ``Gather`` of constant ids)."""
    constant = set(weights) | {t.name for t in model.graph.initializer}
    folded: set[str] = set()
    for node in model.graph.node:  # in topological order
        inputs = [i for i in node.input if i]
        if all(i in constant for i in inputs):
            constant.update(node.output)
            folded.update(inputs)
    return folded


def _onnx_types() -> dict[torch.dtype, int]:
    from onnx import TensorProto

    return {
        torch.float32: TensorProto.FLOAT,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
        torch.float64: TensorProto.DOUBLE,
        torch.int8: TensorProto.INT8,
        torch.uint8: TensorProto.UINT8,
        torch.int16: TensorProto.INT16,
        torch.int32: TensorProto.INT32,
        torch.int64: TensorProto.INT64,
        torch.bool: TensorProto.BOOL,
    }


def tensor_proto(name: str, tensor: torch.Tensor) -> Any:
    """``tensor`` as an ONNX ``TensorProto`` with raw little-endian data."""
    proto = _header(name, tensor)
    if tensor.numel():
        proto.raw_data = tensor_bytes(tensor).tobytes()
    return proto


def _may_be_a_shape(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a small integer tensor, which a node may read as a shape or an
    axis (``Expand``, ``Reshape``): ONNX Runtime's shape inference reads those only inline."""
    small = tensor.numel() * tensor.element_size() < SHARED_MIN_BYTES
    return small and not tensor.is_floating_point() and tensor.dim() <= 1


def _header(name: str, tensor: torch.Tensor) -> Any:
    from onnx import TensorProto

    return TensorProto(name=name, data_type=_onnx_types()[tensor.dtype], dims=list(tensor.shape))


def graph_weights(
    model: Any, tensors: dict[str, torch.Tensor], user_inputs: set[str]
) -> dict[str, torch.Tensor] | None:
    """The value of every graph input not named in ``user_inputs``, in graph order.

    Returns:
        None when one has no value in ``tensors`` or a type ONNX does not store (then the
        exporter must write them itself).
    """
    names = [value.name for value in model.graph.input if value.name not in user_inputs]
    values = [tensors.get(name) for name in names]
    types = _onnx_types()
    if any(not isinstance(t, torch.Tensor) or t.dtype not in types for t in values):
        return None
    return dict(zip(names, values))


def attach_initializers(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Turn the graph inputs named in ``weights`` into initializers holding them, in place."""
    _drop_inputs(model, weights)
    model.graph.initializer.extend(tensor_proto(name, t) for name, t in weights.items())


def _drop_inputs(model: Any, names: dict[str, torch.Tensor]) -> None:
    kept = [value for value in model.graph.input if value.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)


def save_quantized(model: Any, weights: dict[str, torch.Tensor], path: str | Path) -> int:
    """Write a model with ``QuantizeLinear`` nodes: weights attached, quantized weights folded
    to int8 (:func:`~.int8_weights.fold_int8_weights`), serialised once, checked, written (with
    a data file beside it over :data:`~.external_data.EXTERNAL_DATA_BYTES` of weights).

    Returns:
        The number of weights stored as int8.
    """
    import onnx

    attach_initializers(model, weights)
    folded = fold_int8_weights(model) + fold_fp8_weights(model)
    if external_data.initializer_bytes(model) > external_data.EXTERNAL_DATA_BYTES:
        save_model_file(model, path)
        return folded
    data = model.SerializeToString()
    onnx.checker.check_model(data)
    with open_hashed(path) as f:
        f.write(data)
    return folded


def unwritten_float_model(model: Any, weights: dict[str, torch.Tensor]) -> UnwrittenOnnx | None:
    """``model`` checked and held with its weights, to be written (or run) later; None for a
    model with ``QuantizeLinear`` nodes, whose weights are folded at write time instead."""
    import onnx

    if any(node.op_type == "QuantizeLinear" for node in model.graph.node):
        return None
    onnx.checker.check_model(model)
    _drop_inputs(model, weights)
    return UnwrittenOnnx(model, weights)


class OrtInitializers(dict):
    """Name -> numpy array of a model's external initializers, for ONNX Runtime; the names in
    :attr:`shared` are handed over by reference (their arrays must outlive the session), the
    others copied."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: set[str] = set()


class UnwrittenOnnx:
    """A checked float ONNX graph whose initializers are still the exporter's tensors.

    :meth:`write` writes the file; before that, :meth:`ort_source` hands the same model to an
    ONNX Runtime session from memory, so a compile need not wait for the weights to reach the
    disk.

    Args:
        model: the ``ModelProto`` without its weights (neither as inputs nor initializers).
        weights: initializer name -> tensor, in graph order.
    """

    def __init__(self, model: Any, weights: dict[str, torch.Tensor]) -> None:
        self.model = model
        self.weights = weights
        self.copied: set[str] = set(weights)  # which weights are our own copies (all, unknown)
        # name -> W of the weights ONNX Runtime reads as FusedMatMul(transB=1) from W itself
        self.transposed: dict[str, torch.Tensor] = {}
        self.versions = {name: version_of(t) for name, t in weights.items()}

    def make_contiguous(self) -> None:
        """Copy the weights that are views (the exporter's folded transposes) into contiguous
        tensors once, for both :meth:`ort_source` and :meth:`write`; the names of those copies
        are kept in :attr:`copied`. A transposed linear weight that ONNX Runtime can read as
        the model stores it (:mod:`~.transposed_weights`) is not copied: :attr:`transposed`
        keeps its contiguous ``W``, and :meth:`write` copies the view one weight at a time."""
        self.transposed = transposed_weights(self.model, self.weights, SHARED_MIN_BYTES)
        self.copied = {
            name
            for name, t in self.weights.items()
            if not t.is_contiguous() and name not in self.transposed
        }
        self.weights = {
            name: t.detach() if name in self.transposed else t.detach().contiguous()
            for name, t in self.weights.items()
        }
        self.versions = {name: version_of(t) for name, t in self.weights.items()}

    def ort_source(self) -> tuple[bytes, OrtInitializers] | None:
        """The serialised model with every weight marked as external data, and its arrays.

        A float weight the graph shares with the model (not a copy made by
        :meth:`make_contiguous`) of at least :data:`SHARED_MIN_BYTES` is handed to ONNX Runtime
        by reference
        (``OrtInitializers.shared``, at :data:`SHARED_LOCATION`): a kernel that does not repack
        it (``Gather`` on an embedding table) reads the model's own memory, so the sessions of
        one model's graphs (prefill, decode) do not each hold a copy. The others are copied by
        ONNX Runtime (``add_external_initializers``), which frees what it repacks. A linear
        weight in :attr:`transposed` is handed over as the model's own ``W``, read by
        ``FusedMatMul(transB=1)``. None when a weight has no numpy type (bfloat16) or is not on
        the CPU.
        """
        if any(t.device.type != "cpu" or t.dtype == torch.bfloat16 for t in self.weights.values()):
            return None
        copied = self.copied
        model = type(self.model)()
        model.CopyFrom(self.model)
        arrays = OrtInitializers()
        read_transposed(model, self.transposed)
        convolved = {n.input[1] for n in model.graph.node if n.op_type in _REORDERED_WEIGHTS}
        convolved |= _folded_weights(model, self.weights)
        for name, tensor in self.weights.items():
            if not tensor.numel() or _may_be_a_shape(tensor):
                model.graph.initializer.append(tensor_proto(name, tensor))
                continue
            tensor = self.transposed.get(name, tensor)
            arrays[name] = tensor.detach().contiguous().numpy()
            # integer weights (weight-only codes) are copied: ONNX Runtime's DequantizeLinear
            # -> MatMulNBits fusion reads them from the file a shared one names
            shared = (
                name not in copied
                and name not in convolved
                and arrays[name].nbytes >= SHARED_MIN_BYTES
                and tensor.is_floating_point()
            )
            if shared:
                arrays.shared.add(name)
            location = SHARED_LOCATION if shared else "in-memory"
            model.graph.initializer.append(_external_header(name, tensor, location, 0))
        return model.SerializeToString(), arrays

    def write(self, path: Path) -> None:
        """Write the model and then its initializers straight from the tensors' memory.

        Protobuf merges a message field that occurs twice, so the file is the serialised model
        followed by a second ``graph`` field holding only the initializers: each one's
        name/type/dims serialised by protobuf, its ``raw_data`` written from the tensor's
        buffer. Parsers (ONNX, ONNX Runtime, TensorRT) read the same ``ModelProto`` as if it
        had been serialised whole, without the Python protobuf copying every weight.

        Tensors that need a copy to be contiguous are copied on a helper thread one step
        ahead of the writes, so copying and writing overlap. Over
        :data:`~.external_data.EXTERNAL_DATA_BYTES` of weights, they go to the model's one data
        file instead (:meth:`write_with_data_file`).
        """
        total = sum(t.numel() * t.element_size() for t in self.weights.values())
        if total > external_data.EXTERNAL_DATA_BYTES:
            self.write_with_data_file(path)
            return
        size, entries = self._initializer_entries()
        from concurrent.futures import ThreadPoolExecutor

        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedl-copy") as copier,
            open_hashed(path) as f,  # hashed as written: the cache does not read it back
        ):
            f.write(self.model.SerializeToString())
            f.write(_field(_GRAPH, size))
            datas = copier.map(tensor_bytes, [tensor for _, tensor, _ in entries])
            for (head, _, nbytes), data in zip(entries, datas, strict=True):
                if data.nbytes != nbytes:
                    raise RuntimeError(f"initializer {head!r}: {data.nbytes} bytes, not {nbytes}")
                f.write(head)
                f.write(data)
        self.check_unchanged()

    def check_unchanged(self) -> None:
        """Raise if a weight was written in place (its version counter moved) since the export:
        the file is written from the tensors' memory after the compile returns, and would not
        hold the numbers its content key was computed from; the cache then stores nothing."""
        moved = [n for n, t in self.weights.items() if version_of(t) != self.versions.get(n)]
        if moved:
            raise WeightsChangedWhileWritingError(
                f"weight {moved[0]!r} (and {len(moved) - 1} more) was modified in place while "
                "its ONNX file was being written; the file is not cached"
            )

    def current_model(self) -> Any:
        """The ``ModelProto`` with the weights' values as they are now (a copy of each)."""
        model = type(self.model)()
        model.CopyFrom(self.model)
        for name, tensor in self.weights.items():
            model.graph.initializer.append(tensor_proto(name, tensor.detach().contiguous()))
        return model

    def write_with_data_file(self, path: Path) -> None:
        """Write every weight to :func:`~.external_data.data_path` (``model.onnx.data``), each
        at an offset aligned to 4096 bytes, then ``path``: the graph, each initializer pointing
        into the data file by offset and length (ONNX's external-data layout)."""
        from concurrent.futures import ThreadPoolExecutor

        path = Path(path)
        data = data_path(path)
        model = type(self.model)()
        model.CopyFrom(self.model)
        tensors = [(name, t) for name, t in self.weights.items() if t.numel()]
        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedl-copy") as copier,
            open_hashed(data) as f,
        ):
            offset = 0
            for (name, tensor), raw in zip(
                tensors, copier.map(tensor_bytes, [t for _, t in tensors])
            ):
                pad = -offset % _ALIGN
                f.write(bytes(pad))
                offset += pad
                model.graph.initializer.append(_external_header(name, tensor, data.name, offset))
                f.write(raw)
                offset += raw.nbytes
        model.graph.initializer.extend(
            tensor_proto(name, t) for name, t in self.weights.items() if not t.numel()
        )
        self.check_unchanged()
        with open_hashed(path) as f:
            f.write(model.SerializeToString())

    def _initializer_entries(self) -> tuple[int, list[tuple[bytes, torch.Tensor, int]]]:
        """Each initializer's field key, length and header (``raw_data`` to follow), its
        tensor and byte count; and the total size of the second ``graph`` field."""
        entries = []
        for name, tensor in self.weights.items():
            nbytes = tensor.numel() * tensor.element_size()
            head = _header(name, tensor).SerializeToString() + _field(_RAW_DATA, nbytes)
            entries.append((_field(_INITIALIZER, len(head) + nbytes) + head, tensor, nbytes))
        return sum(len(head) + nbytes for head, _, nbytes in entries), entries


def _external_header(name: str, tensor: torch.Tensor, location: str, offset: int) -> Any:
    """The initializer of ``tensor`` with its bytes at ``offset`` in the file ``location``."""
    from onnx import TensorProto

    proto = _header(name, tensor)
    proto.data_location = TensorProto.EXTERNAL
    nbytes = tensor.numel() * tensor.element_size()
    for key, value in (("location", location), ("offset", offset), ("length", nbytes)):
        entry = proto.external_data.add()
        entry.key, entry.value = key, str(value)
    return proto


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(length)


_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9  # ModelProto.graph, .initializer, TensorProto.raw_data
