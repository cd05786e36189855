"""Load an exported artifact back as a callable module: torch tensors in, torch tensors out.

:func:`load` is the other half of :func:`embedl_dynamo.export`: it takes the ``.onnx`` file (or a
TensorRT ``.engine``/``.plan`` file) and returns an :class:`ExportedModule`, an ``nn.Module``
that runs the artifact on the best runtime available here, so an exported model drops into code
that called the PyTorch model:

* ``.onnx``: ONNX Runtime, providers TensorRT EP > CUDA EP > CPU (whichever are installed);
* ``.engine`` / ``.plan``: TensorRT's runtime on CUDA tensors (needs ``tensorrt`` and a GPU).

Inputs may have any batch size when the file was exported with a dynamic batch axis. The JSON
sidecar, when present, is read into ``module.metadata`` (plan report, scales, versions).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedl_dynamo.cache.files import run_in_background
from embedl_dynamo.cache.keys import sha256_file
from embedl_dynamo.deploy.input_check import check_inputs
from embedl_dynamo.deploy.onnx_backend import EmbedlOnnxBackend, providers_for
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.registry import runtime_for_file
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.settings import Settings

__all__ = ["ENGINE_SUFFIXES", "ExportedModule", "load"]

logger = logging.getLogger(__name__)

ENGINE_SUFFIXES = TensorRTRuntime.artifact_suffixes


class ExportedModule(nn.Module):
    """An exported artifact behind the ``nn.Module`` call interface.

    Attributes:
        path: the artifact.
        runtime: the name of the runtime running it (``onnxruntime`` or ``tensorrt``).
        artifact_runtime: that runtime, active (:class:`~embedl_dynamo.runtimes.Runtime`).
        providers: the ONNX Runtime providers in use (empty for TensorRT).
        input_names, output_names: the artifact's graph inputs and outputs.
        metadata: the export sidecar (empty when there is none).
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

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run the artifact.

        Args:
            inputs: one tensor per graph input, in order.

        Returns:
            A tensor for a single-output model, else a tuple, on the inputs' device.
        """
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"{self.path.name} takes {len(self.input_names)} inputs {self.input_names}, "
                f"got {len(inputs)}"
            )
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"input {i} is a {type(t).__name__}; pass torch tensors")
        check_inputs(self.path.name, self.metadata, inputs)  # dtypes, static axes
        self._check_static_axes(inputs)
        outputs = self.artifact_runtime.infer(*inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_static_axes(self, inputs: Sequence[torch.Tensor]) -> None:
        """Name the axis a call cannot change (the sidecar's shapes: a number is static, a
        name dynamic) instead of the runtime's dimension error."""
        specs = self.metadata.get("inputs")
        if not isinstance(specs, list) or len(specs) != len(inputs):
            return
        for i, (spec, t) in enumerate(zip(specs, inputs)):
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not isinstance(shape, list) or len(shape) != t.dim():
                continue
            for axis, (want, got) in enumerate(zip(shape, t.shape)):
                if isinstance(want, int) and want != got:
                    raise ValueError(
                        f"{self.path.name}: input {i} axis {axis} is static ({want}) in this "
                        f"file, got {got}; export with dynamic_shapes (e.g. "
                        f"dynamic_shapes=[{{{axis}: 'seq'}}, ...]) to make it dynamic"
                    )

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}, runtime={self.runtime!r}, providers={self.providers}"


def _metadata(path: Path) -> dict[str, Any]:
    side = sidecar_path(path)
    if not side.is_file():
        return {}
    try:
        data = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        logger.warning("ignoring unreadable sidecar %s: %s", side, exc)
        return {}
    if not isinstance(data, dict):
        logger.warning(
            "ignoring sidecar %s: it holds a JSON %s, not the object export writes",
            side, type(data).__name__,
        )  # fmt: skip
        return {}
    return data


def load(
    path: str | os.PathLike[str],
    device: str = "auto",
    num_threads: int | None = None,
    check_sha256: bool = True,
) -> ExportedModule:
    """Load an artifact written by :func:`embedl_dynamo.export`.

    The file's suffix picks the runtime (:func:`~embedl_dynamo.runtimes.runtime_for_file`),
    which loads it through its public :meth:`~embedl_dynamo.runtimes.Runtime.load_artifact`.

    Args:
        path: an ``.onnx`` file, or a TensorRT engine (``.engine``/``.plan``/``.trt``).
        device: ``auto`` (a GPU provider when installed, else CPU), ``CPU`` or ``CUDA``.
        num_threads: ONNX Runtime intra-op threads (its default when None).
        check_sha256: refuse a file whose bytes differ from the ``onnx_sha256`` its sidecar
            recorded at export, or whose data file (``model.onnx.data``) differs from its
            ``onnx_data_sha256`` (changed weights load silently otherwise).

    Returns:
        An :class:`ExportedModule` in eval mode.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix or device, or a file that no longer matches its sidecar.
        RuntimeError: an engine file where TensorRT is not available.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no artifact at {str(path)!r}; export one with embedl_dynamo.export"
        )
    runtime_cls = runtime_for_file(path)
    metadata = _metadata(path)
    recorded = _recorded_digests(path, metadata) if check_sha256 else {}
    digests: dict[Path, Future[str | None]] = {}
    if runtime_cls is TensorRTRuntime:  # an engine is checked before TensorRT reads it
        for file, sha256 in recorded.items():
            _check_digest(path, file, _sha256_or_none(file), sha256)
    else:  # an ONNX file is data: hashed while ONNX Runtime reads it, the two overlapping
        for file in recorded:
            digests[file] = run_in_background(
                lambda file=file: _sha256_or_none(file), "embedl-load-sha256"
            )
    settings = Settings(num_threads=num_threads)
    if runtime_cls is TensorRTRuntime:
        missing = TensorRTRuntime.missing()
        if missing is not None:
            raise RuntimeError(
                f"{path.name} is a TensorRT engine, which needs TensorRT and a CUDA GPU, but "
                f"{missing}. Load the .onnx file instead."
            )
        runtime: Runtime = TensorRTRuntime.load_artifact(path, settings)
    else:
        if device == "auto":
            device = "CUDA" if EmbedlOnnxBackend.supports_device("CUDA") else "CPU"
        elif device.upper().split(":")[0] not in ("CPU", "CUDA"):
            raise ValueError(f"invalid device={device!r}; valid values: auto, CPU, CUDA")
        runtime = OnnxRuntime.load_artifact(path, settings, providers=providers_for(device.upper()))
        try:
            for file, digest in digests.items():
                _check_digest(path, file, digest.result(), recorded[file])
        except ValueError:
            runtime.deactivate()
            raise
        logger.info("loaded %s on onnxruntime with %s", path, runtime.providers)
    return ExportedModule(path, runtime, metadata).eval()


def _recorded_digests(path: Path, metadata: dict[str, Any]) -> dict[Path, str]:
    """file -> the sha256 the sidecar recorded: the model's, and its data file's if it has one."""
    if metadata.get("onnx_file") != path.name or not metadata.get("onnx_sha256"):
        return {}
    recorded = {path: metadata["onnx_sha256"]}
    data_file, data_sha256 = metadata.get("onnx_data_file"), metadata.get("onnx_data_sha256")
    if data_file and data_sha256 and Path(data_file).name == data_file:
        recorded[path.with_name(data_file)] = data_sha256
    return recorded


def _sha256_or_none(file: Path) -> str | None:
    try:
        return sha256_file(file)
    except FileNotFoundError:
        return None


def _check_digest(path: Path, file: Path, digest: str | None, recorded: str) -> None:
    if digest != recorded:
        raise ValueError(
            f"{file.name} does not match the sha256 its sidecar {sidecar_path(path).name} "
            "recorded at export: it was changed since. Export it again, or pass "
            "check_sha256=False to load it anyway."
        )
