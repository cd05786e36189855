"""The ``tensorrt`` runtime: ONNX -> TensorRT engine (``tensorrt`` Python API) on CUDA tensors.

Build: the cached ONNX artifact is parsed with ``trt.OnnxParser`` into a network, one
optimisation profile covers batch sizes ``1..max(8, 2*batch)`` on the dynamic axis (``opt`` is
the example batch), ``builder.build_serialized_network`` makes the engine and the serialized
engine is stored in the artifact cache (namespace ``trt_engine``, keyed by the ONNX key, the
TensorRT version, the GPU and the profile). Run: ``IExecutionContext.set_input_shape`` /
``set_tensor_address`` on torch CUDA tensors and ``execute_async_v3`` on torch's current
stream, so no host round trip happens.

``tensorrt`` is imported lazily; :meth:`TensorRTRuntime.missing` names what is absent (the
package, a CUDA device, TensorRT >= 10).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.runtimes.artifacts import count_build, onnx_artifact
from embedl_dynamo.runtimes.base import Runtime, check_outputs

__all__ = ["TensorRTRuntime"]

logger = logging.getLogger(__name__)

MIN_TENSORRT_MAJOR = 10


@functools.lru_cache(maxsize=1)
def _missing() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return (
            "the tensorrt package is not installed (pip install tensorrt, TensorRT >= "
            f"{MIN_TENSORRT_MAJOR})"
        )
    if not torch.cuda.is_available():
        return "no CUDA device is available (torch.cuda.is_available() is False)"
    try:
        import tensorrt as trt
    except Exception as exc:  # a stub or a missing libnvinfer
        return f"tensorrt fails to import: {exc}"
    major = int(str(trt.__version__).split(".")[0])
    if major < MIN_TENSORRT_MAJOR:
        return f"TensorRT >= {MIN_TENSORRT_MAJOR} is required, found {trt.__version__}"
    return None


def _torch_dtype(trt: Any, dtype: Any) -> torch.dtype:
    table = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.int32: torch.int32,
        trt.int8: torch.int8,
        trt.bool: torch.bool,
    }
    if hasattr(trt, "int64"):
        table[trt.int64] = torch.int64
    if hasattr(trt, "bfloat16"):
        table[trt.bfloat16] = torch.bfloat16
    return table[dtype]


class TensorRTRuntime(Runtime):
    """A TensorRT engine built from the ONNX artifact, run on torch CUDA tensors."""

    name = "tensorrt"

    @classmethod
    def missing(cls) -> str | None:
        return _missing()

    @property
    def is_jit(self) -> bool:
        return False

    def _profile(self, example_inputs: list[torch.Tensor]) -> list[tuple[tuple, tuple, tuple]]:
        shapes = []
        for t in example_inputs:
            opt = tuple(t.shape)
            if self.settings.dynamic_batch and t.dim() > 0:
                lo, hi = (1, *opt[1:]), (max(8, 2 * opt[0]), *opt[1:])
            else:
                lo, hi = opt, opt
            shapes.append((lo, opt, hi))
        return shapes

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        import tensorrt as trt

        device = torch.device("cuda", torch.cuda.current_device())
        inputs = [t.to(device) for t in example_inputs]
        onnx_path, onnx_key, _ = onnx_artifact(gm, [t.cpu() for t in example_inputs], self.settings)
        profile = self._profile(inputs)
        key = content_key(
            "trt_engine",
            onnx_key,
            trt.__version__,
            torch.cuda.get_device_name(device),
            list(torch.cuda.get_device_capability(device)),
            [[list(s) for s in p] for p in profile],
        )
        cache = ArtifactCache(self.settings.cache_dir, "trt_engine")

        def _build_engine(path: Path) -> None:
            path.write_bytes(self._build_engine(trt, onnx_path, profile))
            count_build("trt_engine")
            logger.info("built TensorRT engine %s", key[:16])

        engine_path, built = cache.get_or_build(key, _build_engine, ".engine")
        self.from_cache = not built
        self._engine_path = engine_path
        self.build_info = {"key": key, "artifact": str(engine_path), "onnx": str(onnx_path)}
        self._activate()
        with torch.no_grad():
            expected = gm.to(device)(*inputs)
        expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
        check_outputs(expected, self._infer(inputs), "TensorRT engine", rtol=1e-2)

    @staticmethod
    def _build_engine(
        trt: Any, onnx_path: Path, profile: list[tuple[tuple, tuple, tuple]]
    ) -> bytes:
        trt_logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(trt_logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, trt_logger)
        if not parser.parse(onnx_path.read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT's ONNX parser rejected the model: {errors}")
        config = builder.create_builder_config()
        opt_profile = builder.create_optimization_profile()
        for i, (lo, opt, hi) in enumerate(profile):
            opt_profile.set_shape(network.get_input(i).name, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError("TensorRT could not build an engine (see TensorRT's log)")
        return bytes(serialized)

    def _activate(self) -> None:
        if getattr(self, "_context", None) is not None:
            return
        import tensorrt as trt

        self._trt = trt
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = runtime.deserialize_cuda_engine(self._engine_path.read_bytes())
        if self._engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {self._engine_path}")
        self._context = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == mode]
        self._outputs = [n for n in names if self._engine.get_tensor_mode(n) != mode]

    def _deactivate(self) -> None:
        self._context = None
        self._engine = None

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        device = torch.device("cuda", torch.cuda.current_device())
        keep = []
        for name, t in zip(self._inputs, args):
            t = t.detach().to(device).contiguous()
            keep.append(t)
            self._context.set_input_shape(name, tuple(t.shape))
            self._context.set_tensor_address(name, t.data_ptr())
        outputs = []
        for name in self._outputs:
            shape = tuple(self._context.get_tensor_shape(name))
            dtype = _torch_dtype(self._trt, self._engine.get_tensor_dtype(name))
            out = torch.empty(shape, dtype=dtype, device=device)
            self._context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        stream = torch.cuda.current_stream(device)
        if not self._context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return tuple(outputs)
