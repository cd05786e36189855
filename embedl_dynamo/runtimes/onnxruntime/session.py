"""ONNX Runtime sessions: the one place this package builds them, with the session options
every one gets (integer weight-only kernels, no dequantising Gemm fusion, worker threads that
do not fight PyTorch's for the cores) and the execution providers, best first."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from embedl_dynamo.onnx.fp8_weights import has_fp8_qdq
from embedl_dynamo.onnx.initializers import SHARED_LOCATION

_PACKAGE_LOGGER = logging.getLogger("embedl_dynamo")


def ort_log_severity() -> int:
    """ONNX Runtime's own log level for the sessions this package builds: fatal only (4),
    unless this package's logging is at DEBUG (then warnings, 2). A failed run raises, and the
    caller says it in one line (a division by zero that runs in PyTorch); ONNX Runtime would
    also print its own red error line to stderr."""
    return 2 if _PACKAGE_LOGGER.isEnabledFor(logging.DEBUG) else 4


__all__ = [
    "CPU_PROVIDER",
    "GPU_PROVIDERS",
    "create_session",
    "device_providers",
    "graph_config",
    "ort_log_severity",
    "ort_providers",
]

CPU_PROVIDER = "CPUExecutionProvider"
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
_PREFERRED = (*GPU_PROVIDERS, CPU_PROVIDER)
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


# Every session's config entries (a caller's own value is kept):
# * integer weights read by DequantizeLinear -> MatMul become MatMulNBits computing in int8
#   (accuracy_level 4; lower levels dequantise the weights to float first). A per-channel
#   DequantizeLinear (int8 weight-only) takes blocks as long as K allows, up to 256 without
#   padding ("-1"), instead of 32: the same scale in each block, so the same numbers, and the
#   kernel streams the weights about a quarter faster;
# * without MatMulAddFusion, which would first turn a 2-d MatMul + bias into a Gemm that
#   dequantises its weights on every call (onnxruntime-genai's builder disables it for its int4
#   models too). Our float linears export as Gemm already, so they do not need it;
# * worker threads that spin within a run only (:func:`_spinning_config`).
_SESSION_CONFIG = {
    "session.qdq_matmulnbits_accuracy_level": "4",
    "session.qdq_matmulnbits_block_size": "-1",
    "optimization.disable_specified_optimizers": "MatMulAddFusion",
}
_NO_SPINNING = {"session.intra_op.allow_spinning": "0"}
_SPINNING_IN_RUNS = {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"}


def graph_config() -> dict[str, str]:
    """The config entries every session gets that decide its optimised graph (what
    :func:`create_session` adds besides the threads' spinning)."""
    return dict(_SESSION_CONFIG)


def _spinning_config() -> dict[str, str]:
    """Whether the session's worker threads spin between the ops of a run.

    A run hands thousands of small ops to its workers (a decode step's), and a worker that
    sleeps between them is woken by the kernel each time; spinning workers pick them up at
    once. They spin within a run only and stop when it returns
    (``session.force_spinning_stop``), so between our calls they leave the cores to PyTorch
    (``generate()``'s loop, graph breaks, the caller's code), whose OpenMP workers (GNU libgomp)
    spin only briefly after each parallel op. Where the process set ``OMP_WAIT_POLICY=ACTIVE``,
    PyTorch's workers keep spinning, and ours sleep rather than fight them for the cores;
    docs/benchmarks/llm-decode.md gives the measurements.
    """
    active = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "ACTIVE"
    return _NO_SPINNING if active else _SPINNING_IN_RUNS


def ort_providers() -> list[str]:
    """Installed ORT execution providers in our order of preference (CPU always last)."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    chosen = [p for p in _PREFERRED if p in available]
    return chosen or [CPU_PROVIDER]


def device_providers(device: str) -> list[str | tuple[str, dict[str, Any]]]:
    """The execution providers that run a session on ``device``, best first.

    Args:
        device: ``auto`` (the GPU providers installed here, else the CPU), ``CPU``, ``CUDA``
            or ``CUDA:<index>`` (any case); with an index, the GPU providers get it as their
            ``device_id`` option (without one, ONNX Runtime's default: GPU 0).

    Returns:
        Provider names, or ``(name, {"device_id": index})``; the CPU provider always last.

    Raises:
        ValueError: an unknown device, or a GPU where this onnxruntime has no GPU provider.
    """
    kind, _, index = device.strip().upper().partition(":")
    if kind not in ("AUTO", "CPU", "CUDA") or (index and (kind != "CUDA" or not index.isdigit())):
        raise ValueError(f"invalid device={device!r}; valid values: auto, CPU, CUDA, CUDA:<index>")
    gpu = [p for p in ort_providers() if p in GPU_PROVIDERS]
    if kind == "CPU" or (kind == "AUTO" and not gpu):
        return [CPU_PROVIDER]
    if not gpu:
        raise ValueError(
            f"device {device!r} needs onnxruntime's CUDA or TensorRT execution provider, but this "
            f"onnxruntime has only {ort_providers()}; install onnxruntime-gpu or use device='CPU'"
        )
    if not index:
        return [*gpu, CPU_PROVIDER]
    return [*((p, {"device_id": int(index)}) for p in gpu), CPU_PROVIDER]


def create_session(
    model: str | os.PathLike[str] | bytes,
    providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
    *,
    num_threads: int | None = None,
    options: Any = None,
    initializers: dict[str, Any] | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession``: the one place this package builds them.

    Args:
        model: an ``.onnx`` path or serialized model bytes.
        providers: execution providers, best first, each a name or ``(name, provider
            options)`` (:func:`device_providers`); :func:`ort_providers` when None.
        num_threads: intra-op threads; when None (and ``options`` sets none), PyTorch's
            ``torch.get_num_threads()``: the process's own choice (``torch.set_num_threads``,
            ``OMP_NUM_THREADS``), by default one per physical core, as ONNX Runtime's.
        options: an ``onnxruntime.SessionOptions`` to start from; when None, full graph
            optimisation (``ORT_ENABLE_ALL``) and warnings-and-above logging only.
        initializers: name -> numpy array for the model's external-data initializers
            (``SessionOptions.add_external_initializers``). ONNX Runtime copies them while it
            loads the model ("the user provided buffers can then be deallocated", its C API
            says), so the session does not keep them; its provider fallback, which would load
            the model again from the options, is disabled. Those named in its ``shared``
            (:class:`~embedl_dynamo.onnx.initializers.OrtInitializers`) are not copied
            (``SessionOptions.add_initializer``): the session reads and keeps them.

    Returns:
        The session.
    """
    import onnxruntime as ort

    if options is None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = ort_log_severity()
    if num_threads is not None:
        options.intra_op_num_threads = num_threads
    elif not options.intra_op_num_threads:  # the threads the process gave PyTorch
        options.intra_op_num_threads = torch.get_num_threads()
    for key, value in {**_SESSION_CONFIG, **_spinning_config()}.items():
        try:  # a caller's own value is kept
            options.get_session_config_entry(key)
        except RuntimeError:
            options.add_session_config_entry(key, value)
    shared = [_share(options, n, initializers[n]) for n in getattr(initializers, "shared", ())]
    if initializers:
        names = [n for n in initializers if n not in getattr(initializers, "shared", ())]
        values = [ort.OrtValue.ortvalue_from_numpy(initializers[n]) for n in names]
        options.add_external_initializers(names, values)
    source = model if isinstance(model, bytes) else os.fspath(model)
    chosen = list(providers) if providers is not None else ort_providers()
    # ONNX Runtime 1.32's CPU ReluQuantFusion drops a Relu before an FP8 QuantizeLinear as if
    # E4M3 clipped at 0 like uint8: keep the rule set that holds it off for FP8 files
    disabled = ["Level2_RuleBasedTransformer"] if has_fp8_qdq(source) else None
    with _shared_placeholder(options, bool(shared)):
        session = ort.InferenceSession(
            source, sess_options=options, providers=chosen, disabled_optimizers=disabled
        )
    if initializers:
        session.disable_fallback()
    if shared:  # ONNX Runtime reads them without holding a reference: the session keeps them
        session.embedl_shared_initializers = shared
    return session


def _share(options: Any, name: str, array: Any) -> tuple[Any, Any]:
    import onnxruntime as ort

    value = ort.OrtValue.ortvalue_from_numpy(array)
    options.add_initializer(name, value)
    return value, array


@contextlib.contextmanager
def _shared_placeholder(options: Any, needed: bool) -> Iterator[None]:
    """ONNX Runtime checks that the external-data file of an initializer given by reference
    exists before it replaces it: an empty one stands in, in a folder of its own."""
    if not needed:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="embedl-ort-") as folder:
        (Path(folder) / SHARED_LOCATION).touch()
        options.add_session_config_entry(_EXTERNAL_FOLDER, folder)
        yield
