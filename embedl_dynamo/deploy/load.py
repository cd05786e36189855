"""Load an exported artifact back as a callable module: torch tensors in, torch tensors out.

:func:`load` is the other half of :func:`embedl_dynamo.export`: it takes the ``.onnx`` file (or a
TensorRT ``.engine``/``.plan`` file) and returns an :class:`ExportedModule`, an ``nn.Module``
that runs the artifact where the export meant it to run, so an exported model drops into code
that called the PyTorch model:

* ``.onnx``: the runtime the sidecar records (``openvino`` for the openvino target, in the
  half precision the file asks for; ``onnxruntime`` otherwise, providers TensorRT EP > CUDA EP
  > CPU, whichever are installed), or the one ``runtime=`` names;
* ``.engine`` / ``.plan``: TensorRT's runtime on CUDA tensors (needs ``tensorrt`` and a GPU).

Inputs may have any batch size when the file was exported with a dynamic batch axis. Outputs
come back in the model's own structure (dicts, nested tuples and lists, ``None``), which the
sidecar records. The JSON sidecar is read into ``module.metadata`` (plan report, scales,
versions) by the one reader that checks its fields (:mod:`~embedl_dynamo.deploy.sidecar_fields`),
and the files are checked against the sha256 it recorded (:mod:`~embedl_dynamo.deploy.integrity`).
A file whose runtime would answer NaN or infinite inputs otherwise than PyTorch (an op with a
listed difference on them, which the sidecar records; quantized activations) refuses such calls
with a ValueError naming the fix (:mod:`~embedl_dynamo.deploy.non_finite`), and a file with the
index flag (:mod:`~embedl_dynamo.deploy.index_flag`) raises ``IndexError`` for a call holding
an index PyTorch refuses.
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedl_dynamo.deploy.index_flag import check_index_flag, has_index_flag
from embedl_dynamo.deploy.input_check import check_inputs
from embedl_dynamo.deploy.integrity import ArtifactCheck
from embedl_dynamo.deploy.non_finite import check_finite_inputs, non_finite_risk
from embedl_dynamo.deploy.sidecar import read_sidecar, recorded_runtime, sidecar_path
from embedl_dynamo.deploy.sidecar_fields import check_threads
from embedl_dynamo.graph.output_tree import OutputTree
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import AUTO, runtime_classes, runtime_for_file
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

__all__ = ["ENGINE_SUFFIXES", "ExportedModule", "device_name", "load"]

logger = logging.getLogger(__name__)

ENGINE_SUFFIXES = TensorRTRuntime.artifact_suffixes


class ExportedModule(nn.Module):
    """An exported artifact behind the ``nn.Module`` call interface.

    Attributes:
        path: the artifact.
        runtime: the name of the runtime running it (``onnxruntime``, ``openvino``,
            ``tensorrt``).
        artifact_runtime: that runtime, active (:class:`~embedl_dynamo.runtimes.Runtime`);
            its ``to_dict()`` is the state it was loaded from, its ``build_info`` what it
            runs (OpenVINO: ``inference_precision``).
        providers: the ONNX Runtime providers in use (empty for other runtimes).
        input_names, output_names: the artifact's graph inputs and outputs.
        output_tree: the model's output structure over them (None: a flat tuple, as a
            sidecar without one, or no sidecar, gives).
        index_flag: whether the file's last output is the index flag
            (:mod:`~embedl_dynamo.deploy.index_flag`): a call that sets it raises
            ``IndexError``, as PyTorch does, and :meth:`forward` leaves it out.
        metadata: the export sidecar (empty when there is none).
        non_finite: why calls whose float inputs hold NaN or infinity are refused
            (:class:`~embedl_dynamo.deploy.non_finite.NonFiniteRisk`), None where they run.
    """

    def __init__(self, path: Path, runtime: Runtime, metadata: dict[str, Any]) -> None:
        super().__init__()
        self.path = path
        self.runtime = runtime.name
        self.artifact_runtime = runtime
        self.input_names = runtime.input_names
        self.output_names = runtime.output_names
        self.providers = runtime.providers if isinstance(runtime, OnnxRuntime) else []
        self.metadata = metadata
        self.index_flag = has_index_flag(self.output_names)
        self._index_ops = _index_ops(metadata)
        count = len(self.output_names) - self.index_flag  # the model's own outputs
        self.output_tree = _output_tree(path, metadata, count)
        self.non_finite = non_finite_risk(runtime.name, metadata)

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run the artifact.

        Args:
            inputs: one tensor per graph input, in order.

        Returns:
            What the model returned, in its structure (:attr:`output_tree`), on the inputs'
            device; without a recorded structure, a tensor for a single-output model, else a
            tuple.

        Raises:
            TypeError: an input is not a tensor, or not of the dtype the file takes.
            ValueError: another number of inputs, a static axis of another size, or NaN or
                infinity in a float input of a file that would answer it with finite numbers
                (:attr:`non_finite`: the message names the input and the fix).
            IndexError: an index of the call is outside the range PyTorch takes (a token id
                of -1), where PyTorch raises it too (:attr:`index_flag`).
        """
        outputs = self.run_flat(*inputs)
        if self.index_flag:
            outputs = outputs[:-1]
        if self.output_tree is not None:
            return self.output_tree.rebuild(outputs, inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def run_flat(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The file's own outputs, flat and in its order (the index flag last, where the file
        has one), checked as :meth:`forward` checks a call (a server splits them by request
        before it rebuilds each one's structure); a set index flag raises ``IndexError``."""
        self.check_call(inputs)
        outputs = tuple(self.artifact_runtime.infer(*inputs))
        if self.index_flag:
            check_index_flag(self.path.name, outputs[-1], self._index_ops)
        return outputs

    def check_call(self, inputs: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        """Refuse what :meth:`forward` refuses before the runtime runs (see its Raises)."""
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"{self.path.name} takes {len(self.input_names)} inputs {self.input_names}, "
                f"got {len(inputs)}"
            )
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"input {i} is a {type(t).__name__}; pass torch tensors")
        check_inputs(self.path.name, self.metadata, inputs)  # dtypes, static axes
        if self.non_finite is not None:
            check_finite_inputs(self.path.name, self.input_names, self.non_finite, inputs)

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}, runtime={self.runtime!r}, providers={self.providers}"


def _index_ops(metadata: dict[str, Any]) -> tuple[str, ...]:
    """The index ops the sidecar says the file's index flag guards (for the message)."""
    guards = metadata.get("guards") or {}
    flag = guards.get("index_out_of_range") or {}
    return tuple(flag.get("ops") or ())


def _output_tree(path: Path, metadata: dict[str, Any], count: int) -> OutputTree | None:
    """The sidecar's output structure, where it fits the file's ``count`` outputs."""
    data = metadata.get("output_tree")
    if data is None:
        return None
    try:
        tree = OutputTree.from_dict(data)
    except (TypeError, ValueError) as exc:
        logger.warning(
            "%s: ignoring the sidecar's output_tree (%s); outputs come back as a flat tuple",
            path.name,
            exc,
        )
        return None
    if tree.count != count:
        logger.warning(
            "%s: the sidecar's output_tree is for %d outputs, the file has %d; "
            "outputs come back as a flat tuple",
            path.name,
            tree.count,
            count,
        )
        return None
    return tree


def load(
    path: str | os.PathLike[str],
    device: str | int | torch.device | None = "auto",
    num_threads: int | None = None,
    check_sha256: bool = True,
    runtime: str = AUTO,
) -> ExportedModule:
    """Load an artifact written by [embedl_dynamo.export][embedl_dynamo.export].

    The runtime is the one the export recorded in the sidecar (``openvino`` for the openvino
    target, else ``onnxruntime``; a TensorRT engine: ``tensorrt``), rebuilt from the sidecar's
    state through `embedl_dynamo.runtimes.Runtime.from_dict`, which loads the file with the
    runtime's `load_artifact`.

    Args:
        path: an ``.onnx`` file, or a TensorRT engine (``.engine``/``.plan``/``.trt``).
        device: ``auto`` (ONNX Runtime: a GPU provider when installed, else the CPU; OpenVINO:
            the CPU), ``CPU``, ``CUDA`` or ``CUDA:<index>`` (ONNX Runtime), ``GPU`` (OpenVINO,
            where it has one); PyTorch's forms too: a ``torch.device`` or its string
            (``"cuda:1"``), an int (a CUDA index, as ``torch.device(1)``), None (``auto``).
            A TensorRT engine runs on the current CUDA device.
        num_threads: the runtime's intra-op threads (its default when None), at most
            `embedl_dynamo.deploy.sidecar_fields.max_threads` (as the sidecar's).
        check_sha256: refuse a file whose bytes differ from the sha256 its sidecar recorded
            at export, whatever the files are called now (`embedl_dynamo.deploy.integrity`).
        runtime: ``auto`` (what the sidecar recorded; ONNX Runtime, with one warning, where
            that runtime is not installed or there is no sidecar), or a runtime that loads
            the file (``onnxruntime``, ``openvino``; ``tensorrt`` for an engine).

    Returns:
        An `ExportedModule` in eval mode. Where its runtime would answer NaN or
        infinities with finite numbers (OpenVINO; quantized activations), a call holding them
        raises ValueError naming the input and the fix (`embedl_dynamo.deploy.non_finite`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix, runtime or device, an out-of-range ``num_threads``, a
            sidecar field export never writes, or a file that no longer matches its sidecar
            (or whose graph reads weights from a file it did not record).
        RuntimeError: an engine file where TensorRT is not available, or a runtime asked for
            by name that is not installed here.

    Example:
        ```python
        module = embedl_dynamo.load("model.onnx")  # on the runtime its sidecar recorded
        y = module(torch.randn(5, 3, 32, 32))  # torch in, torch out, any batch size
        ```
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no artifact at {str(path)!r}; export one with embedl_dynamo.export"
        )
    device = device_name(device)
    check_threads(num_threads)
    default = runtime_for_file(path)
    metadata, unverified = read_sidecar(path)
    runtime_cls = _runtime_class(path, runtime, default, metadata)
    check = ArtifactCheck(path, metadata) if check_sha256 else None
    if check is not None and not check.verifies:
        unverified = unverified or f"its sidecar {sidecar_path(path).name} records no sha256 of it"
    if unverified is not None:
        log = logger.warning if check is not None else logger.info
        log(
            "%s: %s; its content is not verified and it runs on %s",
            path.name,
            unverified,
            runtime_cls.name,
        )
    if runtime_cls is TensorRTRuntime:
        _check_engine(path, check)
    state = _state(path, runtime_cls, metadata, device, num_threads)
    loaded = _checked_runtime(runtime_cls, state, check)
    loaded.deploy()  # served from here on: never deactivated, build-only state released
    logger.info("loaded %s on %s (%s)", path, loaded.name, loaded.describe())
    return ExportedModule(path, loaded, metadata).eval()


def _checked_runtime(
    runtime_cls: type[Runtime], state: dict[str, Any], check: ArtifactCheck | None
) -> Runtime:
    """The runtime loaded from ``state``, its file confirmed by ``check`` (when given) while
    the runtime reads it: an ONNX file is data, hashed as it is read, the two overlapping."""
    try:
        loaded = runtime_cls.from_dict(state)
    except Exception:
        if check is not None:  # a changed file is the cause to report, not the runtime's error
            check.confirm()
        raise
    try:
        if check is not None:
            check.confirm()
    except ValueError:
        loaded.deactivate()
        raise
    return loaded


def _check_engine(path: Path, check: ArtifactCheck | None) -> None:
    """An engine is checked before TensorRT reads it, and TensorRT must be here to read it."""
    if check is not None:
        check.confirm()
    missing = TensorRTRuntime.missing()
    if missing is not None:
        raise RuntimeError(
            f"{path.name} is a TensorRT engine, which needs TensorRT and a CUDA GPU, but "
            f"{missing}. Load the .onnx file instead."
        )


def device_name(device: str | int | torch.device | None) -> str:
    """``load()``'s device as the runtimes name it: PyTorch's forms (``torch.device``, an int
    CUDA index, None) become ``CPU``, ``CUDA``, ``CUDA:<index>`` or ``auto``; a string is
    passed on for the runtime to check.

    Raises:
        ValueError: a value of another type, or a negative index.
    """
    if device is None:
        return AUTO
    if isinstance(device, torch.device):
        kind = device.type.upper()
        return kind if device.index is None else f"{kind}:{device.index}"
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return f"CUDA:{device}"
    if isinstance(device, str):
        return device
    raise ValueError(
        f"invalid device={device!r}; expected 'auto', 'CPU', 'CUDA', 'CUDA:<index>', 'GPU' "
        "(OpenVINO), a torch.device, a CUDA index >= 0 or None"
    )


def _runtime_class(
    path: Path, runtime: str, default: type[Runtime], metadata: dict[str, Any]
) -> type[Runtime]:
    """The runtime that runs ``path``: the one asked for, else the one its sidecar recorded
    (``default``, the suffix's, where it is not installed: with one warning)."""
    suffix = path.suffix.lower()
    classes = runtime_classes()
    loaders = {name: cls for name, cls in classes.items() if suffix in cls.artifact_suffixes}
    if runtime != AUTO:
        if runtime not in loaders:
            why = (
                "no such runtime" if runtime not in classes else f"it does not load {suffix} files"
            )
            raise ValueError(
                f"invalid runtime={runtime!r} for {path.name} ({why}); valid values: "
                f"{', '.join((AUTO, *loaders))}"
            )
        return loaders[runtime]
    recorded = recorded_runtime(metadata)
    if recorded is None or recorded == default.name:
        return default
    if recorded in classes and recorded not in loaders:
        return default  # the record is the .onnx file's, and this is the engine built from it
    cls = loaders.get(recorded)
    missing = cls.missing() if cls is not None else f"no runtime {recorded!r} is registered here"
    if missing is None:
        return cls
    logger.warning(
        "%s was exported to run on %s, which is unavailable here (%s): it runs on %s instead; "
        "pass runtime=%r to choose it without this warning",
        path.name,
        recorded,
        missing,
        default.name,
        default.name,
    )
    return default


def _state(
    path: Path,
    runtime_cls: type[Runtime],
    metadata: dict[str, Any],
    device: str,
    num_threads: int | None,
) -> dict[str, Any]:
    """The runtime's state (:meth:`Runtime.to_dict`) that loads ``path``: the sidecar's where
    it records this runtime, with the file given, the device and the threads asked for."""
    record = metadata.get("runtime")
    state = dict(record) if isinstance(record, dict) else {}
    if state.get("runtime") != runtime_cls.name:
        state = {}
    options = dict(state.get("options") or {})
    if runtime_cls is not TensorRTRuntime:  # an engine runs on the current CUDA device
        options["device"] = device
    try:
        inspect.signature(runtime_cls.load_artifact).bind(path, None, **options)
    except TypeError as exc:
        raise ValueError(
            f"{sidecar_path(path).name} records runtime options {sorted(options)} that "
            f"{runtime_cls.name} does not take ({exc}); export the model again"
        ) from exc
    return {
        "runtime": runtime_cls.name,
        "num_threads": num_threads if num_threads is not None else state.get("num_threads"),
        "options": options,
        "artifacts": {"model": path},
    }
