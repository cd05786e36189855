"""ONNX's backend API (``onnx.backend.base``) over ONNX Runtime, as embedl_dynamo runs it.

Tools written against ONNX's backend API (ONNX's own conformance suite, model zoos' test
harnesses) can run models the way our ``onnxruntime`` runtime does: the same execution-provider
preference (TensorRT EP > CUDA EP > CPU, whichever exist here) and the same session options::

    from embedl_dynamo.runtimes.onnxruntime.onnx_backend import EmbedlOnnxBackend
    rep = EmbedlOnnxBackend.prepare(onnx.load("model.onnx"), device="CPU")
    outputs = rep.run([x])          # a namedtupledict: outputs[0] or outputs["logits"]

``prepare`` validates the model with ``onnx.checker`` first, so a malformed file fails with the
checker's message rather than deep inside ONNX Runtime. A model written for a newer opset, or
op version, than the installed onnxruntime runs is lowered first (see :mod:`.opsets`).

float8, bfloat16, float4 and int4/int2 arrays (``ml_dtypes`` numpy types, as onnx's reference
uses) are fed as ``OrtValue``s built from their bytes with their ONNX element type, since
onnxruntime's numpy conversion knows only numpy's own dtypes; outputs of those types come back
as the same ``ml_dtypes`` arrays (through ``onnx.numpy_helper``, which packs int4/int2).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from embedl_dynamo.runtimes.onnxruntime.opsets import (
    fit_to_onnxruntime,
    fitted_session,
    model_at_opset,
    names_missing_kernel,
    ort_max_opset,
)
from embedl_dynamo.runtimes.onnxruntime.session import (
    create_session,
    device_providers,
    ort_log_severity,
)

__all__ = [
    "SESSION_OPTIONS",
    "EmbedlOnnxBackend",
    "EmbedlOnnxBackendRep",
    "fit_to_onnxruntime",
    "ort_max_opset",
    "prepare",
    "providers_for",
    "run_model",
    "run_node",
    "supports_device",
]

logger = logging.getLogger(__name__)

# ``onnxruntime.SessionOptions`` attributes a caller may set through ``prepare(**kwargs)``.
SESSION_OPTIONS = frozenset(
    {
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "enable_mem_reuse",
        "execution_mode",
        "graph_optimization_level",
        "inter_op_num_threads",
        "intra_op_num_threads",
        "log_severity_level",
        "optimized_model_filepath",
        "use_deterministic_compute",
    }
)

# ONNX element types whose numpy form is an ml_dtypes type, by onnxruntime's type string
_BYTE_FED_TYPES = {
    f"tensor({name.lower()})": getattr(TensorProto, name)
    for name in (
        "BFLOAT16",
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "FLOAT8E8M0",
        "FLOAT4E2M1",
        "INT4",
        "UINT4",
        "INT2",
        "UINT2",
    )
    if hasattr(TensorProto, name)  # newer onnx releases add types
}


def _as_ort_value(array: np.ndarray) -> Any:
    """An ``OrtValue`` of ``array``; ml_dtypes arrays go in as bytes with their ONNX type."""
    import onnxruntime as ort

    elem = helper.np_dtype_to_tensor_dtype(array.dtype)
    if elem not in _BYTE_FED_TYPES.values():
        # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it shape (1,))
        return ort.OrtValue.ortvalue_from_numpy(np.require(array, requirements="C"))
    raw = numpy_helper.from_array(array).raw_data  # int4/int2 packed two/four to a byte
    # onnxruntime wants an array of the element's size and reads the (packed) bytes from its start
    buffer = np.zeros(array.shape, f"u{array.dtype.itemsize}")
    flat = buffer.reshape(-1).view(np.uint8)
    flat[: len(raw)] = np.frombuffer(raw, np.uint8)[: flat.size]
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buffer, elem)


def _from_ort_value(value: Any, type_string: str) -> np.ndarray:
    """The numpy array of an output; ml_dtypes types are rebuilt from the raw bytes."""
    elem = _BYTE_FED_TYPES.get(type_string)
    if elem is None:
        return value.numpy()
    # onnxruntime's numpy conversion has no float8e5m2/int4/int2 form: read the CPU buffer's bytes
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    tensor = helper.make_tensor("output", elem, value.shape(), raw, raw=True)
    return numpy_helper.to_array(tensor)


def providers_for(device: str = "CPU") -> list[str | tuple[str, dict[str, Any]]]:
    """ONNX Runtime execution providers for ``device``, best first, among those installed here
    (the ``onnxruntime`` runtime's :func:`~embedl_dynamo.runtimes.onnxruntime.session.device_providers`).

    Args:
        device: ``"CPU"`` or ``"CUDA"`` (optionally ``"CUDA:1"``: the GPU providers get that
            index as their ``device_id`` option).

    Returns:
        Provider names, or ``(name, {"device_id": index})``; CPU always comes last as the
        fallback.

    Raises:
        ValueError: the device is unknown or not available here (the message says why).
    """
    if device.strip().lower() == "auto":
        raise ValueError(f"invalid device={device!r}; valid values: CPU, CUDA, CUDA:<index>")
    return device_providers(device)


def _session_options(kwargs: dict[str, Any]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = ort_log_severity()  # a caller's own level is set below
    unknown = sorted(set(kwargs) - SESSION_OPTIONS)
    if unknown:
        valid = ", ".join(sorted(SESSION_OPTIONS))
        raise ValueError(f"unknown session option(s) {unknown}; valid options: {valid}")
    for key, value in kwargs.items():
        setattr(options, key, value)
    return options


class EmbedlOnnxBackendRep(BackendRep):
    """A prepared model: an ``onnxruntime.InferenceSession`` and its input/output names."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model once.

        Args:
            inputs: one array, a list of arrays in graph-input order, or a ``{name: array}`` dict.
            kwargs: unused (kept for the API's signature).

        Returns:
            A namedtupledict of numpy arrays, indexable by position or output name.
        """
        feeds = self._feeds(inputs)
        types = {o.name: o.type for o in self.session.get_outputs()}
        if any(
            helper.np_dtype_to_tensor_dtype(a.dtype) in _BYTE_FED_TYPES.values()
            for a in feeds.values()
        ) or any(t in _BYTE_FED_TYPES for t in types.values()):
            values = self.session.run_with_ort_values(
                self.output_names, {k: _as_ort_value(a) for k, a in feeds.items()}
            )
            outputs = [_from_ort_value(v, types[n]) for v, n in zip(values, self.output_names)]
        else:
            outputs = self.session.run(self.output_names, feeds)
        return namedtupledict("Outputs", self.output_names)(*outputs)

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, dict):
            missing = sorted(set(self.input_names) - set(inputs))
            if missing:
                raise ValueError(f"missing inputs {missing}; the model takes {self.input_names}")
            return {name: np.asarray(inputs[name]) for name in self.input_names}
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"the model takes {len(self.input_names)} inputs {self.input_names}, "
                f"got {len(inputs)}"
            )
        return {name: np.asarray(x) for name, x in zip(self.input_names, inputs)}


class EmbedlOnnxBackend(Backend):
    """ONNX's ``Backend`` interface, running models on ONNX Runtime the way embedl_dynamo does."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether ``device`` (``"CPU"``, ``"CUDA"``) can run here."""
        try:
            providers_for(device)
        except ValueError:
            return False
        return True

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether the device is available and ONNX Runtime accepts every op of ``model``.

        Compatibility is decided by ONNX Runtime itself (a session is created), so a model with an
        op or opset this onnxruntime lacks is reported incompatible rather than guessed at.
        """
        if not cls.supports_device(device):
            return False
        try:
            cls.prepare(model, device, **kwargs)
        except Exception as exc:  # ORT raises several exception types for unsupported models
            logger.debug("model not compatible with onnxruntime: %s", exc)
            return False
        return True

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str | bytes, device: str = "CPU", **kwargs: Any
    ) -> EmbedlOnnxBackendRep:
        """Check ``model`` and create an ONNX Runtime session for it.

        Args:
            model: a ``ModelProto``, a path to an ``.onnx`` file, or serialized bytes.
            device: ``"CPU"`` or ``"CUDA"``.
            kwargs: ``onnxruntime.SessionOptions`` attributes (see :data:`SESSION_OPTIONS`).

        Returns:
            The prepared :class:`EmbedlOnnxBackendRep`.
        """
        providers = providers_for(device)
        options = _session_options(kwargs)
        if isinstance(model, str):
            onnx.checker.check_model(model)
            try:  # a file is handed to ONNX Runtime as a path (external data stays on disk)
                return EmbedlOnnxBackendRep(create_session(model, providers, options=options))
            except Exception as exc:  # ORT raises several exception types for unsupported models
                if not names_missing_kernel(exc):
                    raise
            model = onnx.load(model)
        elif isinstance(model, bytes):
            model = onnx.load_from_string(model)
        super().prepare(model, device)  # runs onnx.checker.check_model
        return EmbedlOnnxBackendRep(fitted_session(model, providers, options))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        """Prepare ``model`` and run it once on ``inputs``; returns a namedtupledict."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (numpy arrays, in the node's input order).

        The node is wrapped in a one-node model whose input types come from the arrays and whose
        output types come from ``outputs_info`` or, when absent, from ONNX shape inference.

        Args:
            node: the node.
            inputs: a list of arrays, one per non-empty node input.
            device: ``"CPU"`` or ``"CUDA"``.
            outputs_info: ``(dtype, shape)`` per output (optional).
            kwargs: ``opset_version`` (default: the newest onnxruntime runs, see
                :func:`ort_max_opset`), then session options.

        Returns:
            A namedtupledict of the node's outputs.
        """
        opset = kwargs.pop("opset_version", None) or ort_max_opset()
        super().run_node(node, inputs, device, outputs_info, opset_version=opset)
        names = [name for name in node.input if name]
        arrays = [np.asarray(x) for x in (inputs.values() if isinstance(inputs, dict) else inputs)]
        if len(arrays) != len(names):
            raise ValueError(f"node {node.op_type} has inputs {names}, got {len(arrays)} arrays")
        graph_inputs = [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for name, a in zip(names, arrays)
        ]
        graph_outputs = _output_infos(node, graph_inputs, outputs_info, opset)
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
        model = model_at_opset(graph, opset)
        return cls.run_model(model, arrays, device, **kwargs)


def _output_infos(
    node: onnx.NodeProto,
    graph_inputs: list[onnx.ValueInfoProto],
    outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None,
    opset: int,
) -> list[onnx.ValueInfoProto]:
    outputs = [name for name in node.output if name]
    if outputs_info is not None:
        return [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape)
            )
            for name, (dtype, shape) in zip(outputs, outputs_info)
        ]
    probe = model_at_opset(helper.make_graph([node], "probe", graph_inputs, []), opset)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
    infos = []
    for name in outputs:
        if name not in inferred:
            raise ValueError(
                f"cannot infer the type of output {name!r} of {node.op_type}; pass outputs_info"
            )
        infos.append(inferred[name])
    return infos


# Module-level functions, as ONNX's backend modules expose them (``backend.prepare(...)``).
prepare = EmbedlOnnxBackend.prepare
run_model = EmbedlOnnxBackend.run_model
run_node = EmbedlOnnxBackend.run_node
supports_device = EmbedlOnnxBackend.supports_device
