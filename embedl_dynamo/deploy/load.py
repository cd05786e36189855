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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["ENGINE_SUFFIXES", "ExportedModule", "load"]

logger = logging.getLogger(__name__)

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


class ExportedModule(nn.Module):
    """An exported artifact behind the ``nn.Module`` call interface.

    Attributes:
        path: the artifact.
        runtime: ``onnxruntime`` or ``tensorrt``.
        providers: the ONNX Runtime providers in use (empty for TensorRT).
        input_names, output_names: the artifact's graph inputs and outputs.
        metadata: the export sidecar (empty when there is none).
    """

    def __init__(
        self,
        path: Path,
        runtime: str,
        session: Any,
        input_names: list[str],
        output_names: list[str],
        providers: list[str],
        metadata: dict[str, Any],
    ) -> None:
        super().__init__()
        self.path = path
        self.runtime = runtime
        self.session = session
        self.input_names = input_names
        self.output_names = output_names
        self.providers = providers
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
        if self.runtime == "tensorrt":
            outputs = self.session(*inputs)
        else:
            outputs = self._run_ort(inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _run_ort(self, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        device = inputs[0].device
        # numpy views of contiguous CPU tensors: no copy in; outputs wrapped without a copy.
        feeds = {
            name: t.detach().to("cpu").contiguous().numpy()
            for name, t in zip(self.input_names, inputs)
        }
        outputs = self.session.run(self.output_names, feeds)
        return [torch.from_numpy(np.ascontiguousarray(o)).to(device) for o in outputs]

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}, runtime={self.runtime!r}, providers={self.providers}"


def _metadata(path: Path) -> dict[str, Any]:
    from embedl_dynamo.deploy.export import sidecar_path

    side = sidecar_path(path)
    if not side.is_file():
        return {}
    try:
        return json.loads(side.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        logger.warning("ignoring unreadable sidecar %s: %s", side, exc)
        return {}


def _load_onnx(path: Path, device: str, num_threads: int | None) -> ExportedModule:
    from embedl_dynamo.deploy.onnx_backend import providers_for
    from embedl_dynamo.runtimes.onnxruntime import create_session

    session = create_session(path, providers_for(device), num_threads=num_threads)
    used = session.get_providers()
    logger.info("loaded %s on onnxruntime with %s", path, used)
    return ExportedModule(
        path,
        "onnxruntime",
        session,
        [i.name for i in session.get_inputs()],
        [o.name for o in session.get_outputs()],
        used,
        _metadata(path),
    )


def _load_engine(path: Path) -> ExportedModule:
    from embedl_dynamo.runtimes.tensorrt import TensorRTRuntime

    missing = TensorRTRuntime.missing()
    if missing is not None:
        raise RuntimeError(
            f"{path.name} is a TensorRT engine, which needs TensorRT and a CUDA GPU, but "
            f"{missing}. Load the .onnx file instead."
        )
    runtime = TensorRTRuntime()
    runtime._engine_path = path  # the runtime's deserialisation and run loop, on this file
    runtime._activate()

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return runtime._infer(inputs)

    return ExportedModule(
        path,
        "tensorrt",
        run,
        list(runtime._inputs),
        list(runtime._outputs),
        [],
        _metadata(path),
    )


def load(
    path: str | os.PathLike[str], device: str = "auto", num_threads: int | None = None
) -> ExportedModule:
    """Load an artifact written by :func:`embedl_dynamo.export`.

    Args:
        path: an ``.onnx`` file, or a TensorRT engine (``.engine``/``.plan``/``.trt``).
        device: ``auto`` (a GPU provider when installed, else CPU), ``CPU`` or ``CUDA``.
        num_threads: ONNX Runtime intra-op threads (its default when None).

    Returns:
        An :class:`ExportedModule` in eval mode.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix or device.
        RuntimeError: an engine file where TensorRT is not available.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no artifact at {str(path)!r}; export one with embedl_dynamo.export"
        )
    suffix = path.suffix.lower()
    if suffix in ENGINE_SUFFIXES:
        return _load_engine(path).eval()
    if suffix != ".onnx":
        raise ValueError(
            f"cannot load {path.name}: expected .onnx or a TensorRT engine "
            f"({', '.join(ENGINE_SUFFIXES)})"
        )
    if device == "auto":
        from embedl_dynamo.deploy.onnx_backend import EmbedlOnnxBackend

        device = "CUDA" if EmbedlOnnxBackend.supports_device("CUDA") else "CPU"
    elif device.upper().split(":")[0] not in ("CPU", "CUDA"):
        raise ValueError(f"invalid device={device!r}; valid values: auto, CPU, CUDA")
    return _load_onnx(path, device.upper(), num_threads).eval()
