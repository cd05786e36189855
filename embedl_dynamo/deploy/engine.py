"""``export(..., engine=True)``: a TensorRT engine file beside the ONNX file."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import atomic_write_bytes
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.errors import EngineUnavailableError
from embedl_dynamo.graph.dynamic_axes import batch_axes
from embedl_dynamo.runtimes.base import target_device
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime, build_engine, engine_profile
from embedl_dynamo.settings import Settings

__all__ = ["build_engine_file"]

logger = logging.getLogger(__name__)


def build_engine_file(onnx_path: Path, args: tuple[torch.Tensor, ...], settings: Settings) -> Path:
    """A TensorRT engine next to the ONNX file, built by the tensorrt runtime's public builder.

    :func:`~embedl_dynamo.runtimes.tensorrt.runtime.build_engine` parses the file into a strongly typed
    network with one optimisation profile over the dynamic batch
    (:func:`~embedl_dynamo.runtimes.tensorrt.runtime.engine_profile`); INT8 comes from the explicit QDQ
    nodes. The engine is cached in the artifact cache keyed by the ONNX file's bytes, the
    TensorRT version, the GPU and the profile, then copied next to the ONNX file.
    """
    missing = TensorRTRuntime.missing()
    if missing is not None:
        raise EngineUnavailableError(
            f"engine=True needs TensorRT and a CUDA GPU, but {missing}. Install "
            "'tensorrt>=11.0,<11.1' on an NVIDIA machine, or export with engine=False and build "
            "the engine there (trtexec --onnx=...)."
        )
    import tensorrt as trt

    device = target_device()
    axes = batch_axes(list(args), (), settings.dynamic_batch)
    profile = engine_profile(list(args), axes, settings.max_batch, settings.max_seq)
    key = content_key(
        "trt_engine_export",
        sha256_file(onnx_path),
        trt.__version__,
        torch.cuda.get_device_name(device),
        list(torch.cuda.get_device_capability(device)),
        [[list(s) for s in p] for p in profile],
    )

    def _build(target: Path) -> None:
        target.write_bytes(build_engine(trt, onnx_path, profile))

    cached, built = ArtifactCache(settings.cache_dir, "trt_engine").get_or_build(
        key, _build, ".engine"
    )
    logger.info("TensorRT engine %s (%s)", key[:16], "built" if built else "from cache")
    engine_path = onnx_path.with_suffix(".engine")
    atomic_write_bytes(engine_path, Path(cached).read_bytes())
    return engine_path
