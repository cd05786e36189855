"""A Triton Inference Server model repository from an exported file and its JSON sidecar.

Triton serves a directory: ``<repo>/<model>/config.pbtxt`` (a ``ModelConfig`` protobuf in text
form) and ``<repo>/<model>/<version>/`` with the model file, the newest version served (a
re-export writes the next one). :func:`write_triton_repository` writes both for a file
:func:`~embedl_dynamo.export` wrote:

* the backend that runs it: ``onnxruntime`` and ``openvino`` read ``model.onnx`` (and its data
  file, under the name the model refers to); a TensorRT engine is copied to ``model.plan`` for
  the ``tensorrt`` backend, and the ``tensorrt`` target without an engine is served by ONNX
  Runtime with its TensorRT execution accelerator (TensorRT builds the engine when Triton loads
  the model);
* inputs and outputs with Triton's data types and dims, read from the ONNX graph;
* ``max_batch_size`` and ``dynamic_batching`` when every input and output has the dynamic batch
  axis first (the dims then leave it out); a static batch gives ``max_batch_size: 0`` and the
  full dims;
* the index flag (:mod:`~embedl_dynamo.deploy.index_flag`): Triton runs the file without
  ``load()``'s check, so the flag is an output its clients read, and the config says so in
  comments; ``dynamic_batching`` is left out, so each run holds one request and its flag is
  that request's own;
* ``model_warmup``, and ``preferred_batch_size`` (:mod:`embedl_dynamo.deploy.triton_warmup`);
* an ``instance_group`` (``KIND_CPU``, or ``KIND_GPU`` for TensorRT) with the runtime's thread
  settings as parameters: ONNX Runtime's ``intra_op_thread_count`` per instance, OpenVINO's
  ``NUM_STREAMS`` (one per instance) and ``INFERENCE_NUM_THREADS`` (all instances together).

The config is built as tritonclient's ``model_config_pb2.ModelConfig`` (the schema Triton parses)
and written with protobuf's ``text_format``; tritonclient is imported only here.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from embedl_dynamo.cache.files import atomic_write_text
from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT, has_index_flag
from embedl_dynamo.deploy.sidecar import read_sidecar, sidecar_path
from embedl_dynamo.deploy.triton_versions import latest_version, write_version
from embedl_dynamo.deploy.triton_warmup import add_warmup, prefer_batch_sizes
from embedl_dynamo.errors import ExportArgumentError, RuntimeUnavailableError
from embedl_dynamo.onnx.external_data import external_locations

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "TRITON_BACKENDS",
    "TritonTensor",
    "batch_axis_everywhere",
    "graph_tensors",
    "latest_version",
    "triton_data_type",
    "write_triton_repository",
]

logger = logging.getLogger(__name__)

TRITON_BACKENDS = ("onnxruntime", "openvino", "tensorrt")
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_QUEUE_DELAY_US = 1000
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

# ONNX TensorProto element type -> Triton DataType name (model_config.proto)
_DATA_TYPES = {
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.UINT16: "TYPE_UINT16",
    onnx.TensorProto.UINT32: "TYPE_UINT32",
    onnx.TensorProto.UINT64: "TYPE_UINT64",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
    onnx.TensorProto.STRING: "TYPE_STRING",
}


@dataclass(frozen=True)
class TritonTensor:
    """One graph input or output: its name, Triton data type and dims (-1 where dynamic).

    ``batch_axis`` says whether dim 0 is dynamic (a named or unknown size).
    """

    name: str
    data_type: str
    dims: tuple[int, ...]
    batch_axis: bool


def triton_data_type(elem_type: int) -> str:
    """Triton's data type name for an ONNX element type (``FLOAT`` -> ``TYPE_FP32``)."""
    try:
        return _DATA_TYPES[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise ExportArgumentError(f"ONNX type {name} has no Triton data type") from None


def graph_tensors(model: onnx.ModelProto) -> tuple[list[TritonTensor], list[TritonTensor]]:
    """The graph's inputs (initializers left out) and outputs as :class:`TritonTensor`."""
    weights = {t.name for t in model.graph.initializer}

    def tensor(value: onnx.ValueInfoProto) -> TritonTensor:
        kind = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
        return TritonTensor(
            value.name, triton_data_type(kind.elem_type), dims, bool(dims) and dims[0] == -1
        )

    inputs = [tensor(v) for v in model.graph.input if v.name not in weights]
    return inputs, [tensor(v) for v in model.graph.output]


def _model_config_pb2() -> Any:
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise RuntimeUnavailableError(
            f"writing a Triton model repository needs tritonclient ({exc}); "
            "pip install 'tritonclient[grpc,http]>=2.40' (the serve extra's client)"
        ) from exc
    return model_config_pb2


def _triton_backend(sidecar: dict[str, Any], backend: str | None) -> str:
    """The Triton backend: as asked, else the export's target (``onnxruntime`` for a target
    Triton has no backend of its own for)."""
    if backend is None:
        target = (sidecar.get("backend") or {}).get("name")
        backend = target if target in TRITON_BACKENDS else "onnxruntime"
    if backend not in TRITON_BACKENDS:
        raise ExportArgumentError(
            f"unknown Triton backend {backend!r}; choose one of {', '.join(TRITON_BACKENDS)}"
        )
    return backend


def batch_axis_everywhere(
    inputs: list[TritonTensor], outputs: list[TritonTensor], sidecar: dict[str, Any]
) -> bool:
    """Whether Triton may batch: every input and output has the dynamic batch axis first (the
    sidecar's ``batch``; without a sidecar, a dynamic dim 0 everywhere)."""
    specs = [*(sidecar.get("inputs") or []), *(sidecar.get("outputs") or [])]
    if specs:
        named = all(isinstance(s, dict) and (s.get("shape") or [None])[0] == "batch" for s in specs)
        return named and len(specs) == len(inputs) + len(outputs)
    return all(t.batch_axis for t in [*inputs, *outputs])


def _check_arguments(
    name: str,
    instances: int,
    threads: int | None,
    max_batch_size: int | None,
    queue_delay_us: int,
) -> None:
    if not _MODEL_NAME.match(name):
        raise ExportArgumentError(
            f"Triton model name {name!r} must be letters, digits, '_', '-' or '.'; pass name=..."
        )
    for label, value, low in (
        ("instances", instances, 1),
        ("threads", threads, 0),
        ("max_batch_size", max_batch_size, 1),
        ("queue_delay_us", queue_delay_us, 0),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < low
        ):
            raise ExportArgumentError(f"{label}={value!r}: give an integer >= {low}")


def _engine_file(path: Path, sidecar: dict[str, Any]) -> Path | None:
    engine = sidecar.get("engine_file")
    return path.with_name(engine) if engine and path.with_name(engine).is_file() else None


def _instance_group(config: Any, pb2: Any, gpu: bool, instances: int) -> None:
    group = config.instance_group.add()
    group.count = instances
    group.kind = pb2.ModelInstanceGroup.KIND_GPU if gpu else pb2.ModelInstanceGroup.KIND_CPU


def _parameter(config: Any, key: str, value: int | str) -> None:
    config.parameters[key].string_value = str(value)


def _runtime_settings(
    config: Any, backend: str, plan: bool, instances: int, threads: int | None, precision: str
) -> None:
    """The runtime's thread settings (and, for TensorRT through ONNX Runtime, its accelerator):
    ``threads`` per instance, 0 or None leaving the runtime's own default."""
    per_instance = threads or 0
    if backend == "onnxruntime":
        _parameter(config, "intra_op_thread_count", per_instance)
        _parameter(config, "inter_op_thread_count", 1)
    elif backend == "openvino":
        config.default_model_filename = "model.onnx"  # the backend's default is model.xml
        _parameter(config, "NUM_STREAMS", instances)
        _parameter(config, "INFERENCE_NUM_THREADS", per_instance * instances)
    elif not plan:  # the tensorrt target as an ONNX file: ONNX Runtime's TensorRT accelerator
        accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add()
        accelerator.name = "tensorrt"
        mode = {"int8": "INT8", "mixed": "INT8", "fp16": "FP16"}.get(precision, "FP32")
        accelerator.parameters["precision_mode"] = mode


def _build_config(
    path: Path,
    name: str,
    backend: str,
    plan: bool,
    sidecar: dict[str, Any],
    instances: int,
    threads: int | None,
    max_batch_size: int | None,
    queue_delay_us: int,
    preferred_batch_sizes: Sequence[int] | None = None,
) -> Any:
    """The ``ModelConfig`` of the model at ``path`` (see :func:`write_triton_repository`)."""
    pb2 = _model_config_pb2()
    model = onnx.load(str(path), load_external_data=False)
    inputs, outputs = graph_tensors(model)
    batching = batch_axis_everywhere(inputs, outputs, sidecar)
    config = pb2.ModelConfig(name=name, backend="tensorrt" if plan else backend)
    if backend == "tensorrt" and not plan:
        config.backend = "onnxruntime"
    if batching:
        settings = sidecar.get("settings") or {}
        limit = (settings.get("max_batch") or 32) if plan else None  # the engine's profile
        config.max_batch_size = max_batch_size or min(DEFAULT_MAX_BATCH_SIZE, limit or 1 << 30)
        if limit is not None and config.max_batch_size > limit:
            raise ExportArgumentError(
                f"max_batch_size={config.max_batch_size} exceeds the engine's profile "
                f"({limit}); export with options={{'max_batch': N}} or lower it"
            )
        if not has_index_flag([t.name for t in outputs]):  # else each run is one request's
            config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    elif max_batch_size is not None:
        raise ExportArgumentError(
            f"{path.name} has no dynamic batch axis on every input and output, so Triton cannot "
            "batch it; drop max_batch_size or export with dynamic_batch=True"
        )
    for tensors, field in ((inputs, config.input), (outputs, config.output)):
        for t in tensors:
            dims = list(t.dims[1:] if batching else t.dims)
            entry = field.add(name=t.name, data_type=pb2.DataType.Value(t.data_type), dims=dims)
            if not dims:  # Triton needs a dim: [1], reshaped to the model's scalar (per sample)
                entry.dims.append(1)
                entry.reshape.SetInParent()
    prefer_batch_sizes(config, preferred_batch_sizes)
    add_warmup(config, pb2)
    _instance_group(config, pb2, backend == "tensorrt", instances)
    precision = str(sidecar.get("precision") or "fp32")
    _runtime_settings(config, backend, plan, instances, threads, precision)
    return config


def _index_flag_note(config: Any, sidecar: dict[str, Any]) -> str:
    """Comment lines for ``config.pbtxt`` on the index flag output, where the model has one:
    what it says, that clients must read it, and why Triton does not batch across requests."""
    if not has_index_flag([o.name for o in config.output]):
        return ""
    flag = ((sidecar.get("guards") or {}).get("index_out_of_range")) or {}
    ops = f" ({', '.join(flag.get('ops') or [])})" if flag.get("ops") else ""
    lines = [
        f"output {INDEX_FLAG_OUTPUT} is True when an index of the request is outside the range",
        f"PyTorch takes{ops}, where PyTorch raises IndexError: clients must read it and",
        "discard the other outputs when it is set (embedl_dynamo.load() raises instead).",
    ]
    if config.max_batch_size:
        lines += [
            "dynamic_batching is left out so that each run holds one request and the flag is",
            "that request's own; with dynamic_batching it is set for every request of a batch",
            "that held such an index.",
        ]
    return "".join(f"# {line}\n" for line in lines)


def _version_files(path: Path, engine: Path | None) -> dict[str, Path]:
    """The files a version of the model holds (name in the version: source): the TensorRT
    engine as ``model.plan``, else ``model.onnx`` and its data files under the names the model
    refers to (which must lie beside it)."""
    if engine is not None:
        return {"model.plan": engine}
    files = {}
    model = onnx.load(str(path), load_external_data=False)
    for location in sorted(external_locations(model)):  # the names the model refers to
        if Path(location).name != location:
            raise ExportArgumentError(
                f"{path.name} keeps weights in {location!r}, outside its own directory; "
                "re-export it (its data file goes beside it)"
            )
        files[location] = path.parent / location
    files["model.onnx"] = path
    return files


def write_triton_repository(
    path: str | os.PathLike[str],
    repository: str | os.PathLike[str],
    *,
    name: str | None = None,
    backend: str | None = None,
    instances: int = 1,
    threads: int | None = None,
    max_batch_size: int | None = None,
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    preferred_batch_sizes: Sequence[int] | None = None,
) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` and a new version ``<repository>/<name>/<n>/``
    for an export: ``1`` in a new repository, else the newest version's number plus one
    (:func:`~.triton_versions.write_version`: Triton serves the newest; a re-export of the same
    bytes keeps it).

    Args:
        path: the ``.onnx`` file :func:`~embedl_dynamo.export` wrote (its sidecar beside it
            says the target, the batch axis and the engine file, when one was built).
        repository: the model repository directory (created if missing).
        name: the model's name in Triton (default: the file's stem).
        backend: ``onnxruntime``, ``openvino`` or ``tensorrt``; default: the export's target.
        instances: model instances (``instance_group`` count).
        threads: CPU threads per instance; None or 0 leaves the runtime's default.
        max_batch_size: the largest batch Triton forms (default 8, capped by a TensorRT
            engine's profile); only for a file with a dynamic batch axis.
        queue_delay_us: ``dynamic_batching``'s ``max_queue_delay_microseconds``.
        preferred_batch_sizes: the batcher's ``preferred_batch_size`` (<= ``max_batch_size``).

    Returns:
        The model's directory (``<repository>/<name>``).

    Raises:
        ExportArgumentError: a bad name or setting, or a batch size the file cannot take.
        RuntimeUnavailableError: tritonclient is not installed.
    """
    from google.protobuf import text_format

    path, name = Path(path), name or Path(path).stem
    if not path.is_file():
        raise ExportArgumentError(f"no model at {str(path)!r}; export one first")
    _check_arguments(name, instances, threads, max_batch_size, queue_delay_us)
    try:
        sidecar, ignored = read_sidecar(path)
    except ValueError as exc:  # an edited sidecar: its fields set the config
        raise ExportArgumentError(str(exc)) from exc
    if ignored is not None:  # none, or not ours: the config is read from the ONNX file alone
        log = logger.warning if sidecar_path(path).exists() else logger.debug
        log("%s: %s; the config is read from the ONNX file alone", path.name, ignored)
    backend = _triton_backend(sidecar, backend)
    engine = _engine_file(path, sidecar) if backend == "tensorrt" else None
    config = _build_config(
        path,
        name,
        backend,
        engine is not None,
        sidecar,
        instances,
        threads,
        max_batch_size,
        queue_delay_us,
        preferred_batch_sizes,
    )
    model_dir = Path(repository) / name
    version = write_version(model_dir, _version_files(path, engine))
    text = _index_flag_note(config, sidecar) + text_format.MessageToString(config)
    atomic_write_text(model_dir / "config.pbtxt", text)
    what = (name, version, config.backend, model_dir)
    logger.info("wrote Triton model %s version %d (%s backend) to %s", *what)
    return model_dir
