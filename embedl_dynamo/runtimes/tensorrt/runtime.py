"""The ``tensorrt`` runtime: ONNX -> TensorRT engine (``tensorrt`` Python API) on CUDA tensors.

Build: the ONNX artifact (exported from a CPU copy of the graph, so weights and inputs share a
device) is parsed with ``trt.OnnxParser`` into a *strongly typed* network (the network's own
dtypes, Q/DQ nodes included, decide precision: the only mode of TensorRT 11, and valid on 10),
one optimisation profile (:func:`engine_profile`) covers the dynamic batch, and
:func:`build_engine` serializes the engine, which is stored in the artifact cache (namespace
``trt_engine``, keyed by the ONNX key, the TensorRT version, the GPU and the profile's
ranges). Run:
``set_input_shape`` / ``set_tensor_address`` by tensor *name* on torch CUDA tensors and
``execute_async_v3`` on the runtime's own CUDA stream, ordered after torch's current stream.

``tensorrt`` is imported lazily; :meth:`TensorRTRuntime.missing` names what is absent (the
package, a CUDA device, TensorRT >= 10).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, package_version
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.graph.dynamic_axes import BATCH, DynamicAxes, batch_axes
from embedl_dynamo.onnx.artifact import onnx_artifact
from embedl_dynamo.runtimes.base import Runtime, target_device
from embedl_dynamo.settings import Settings

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_SEQ",
    "MIN_TENSORRT_MAJOR",
    "TensorRTRuntime",
    "build_engine",
    "engine_profile",
]

logger = logging.getLogger(__name__)

MIN_TENSORRT_MAJOR = 10
DEFAULT_MAX_BATCH = 32  # an engine profile's largest batch unless ``max_batch`` says otherwise
DEFAULT_MAX_SEQ = 512  # ... and largest size of any other dynamic axis (``max_seq``)


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


# TensorRT dtype name -> torch dtype; names absent from an older TensorRT are skipped
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "fp8": torch.float8_e4m3fn,
}


def _torch_dtype(trt: Any, dtype: Any) -> torch.dtype:
    for name, torch_dtype in _DTYPES.items():
        if getattr(trt, name, None) == dtype:
            return torch_dtype
    raise TypeError(f"TensorRT tensor dtype {dtype} has no torch equivalent here")


def engine_profile(
    example_inputs: Sequence[torch.Tensor],
    axes: DynamicAxes,
    max_batch: int | None = None,
    max_seq: int | None = None,
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shape per input for one optimisation profile.

    Exactly the axes the ONNX file declares dynamic (``axes``, Dynamo's symbolic sizes) range
    from 1 to a maximum; ``opt`` is the example's size; every other axis is fixed. The batch
    axis tops out at ``max_batch`` (default :data:`DEFAULT_MAX_BATCH`, or the example's batch
    if larger), any other dynamic axis (sequence length, image side) at ``max_seq`` (default
    :data:`DEFAULT_MAX_SEQ`, or the example's size if larger). The defaults do not grow with
    the example, so the example Dynamo recompiles with (its second batch size) asks for the
    engine already built.

    Raises:
        ValueError: a maximum is smaller than the example's size.
    """
    shapes = []
    for index, t in enumerate(example_inputs):
        opt = tuple(int(d) for d in t.shape)
        dynamic = axes.inputs[index] if index < len(axes.inputs) else {}
        low, high = list(opt), list(opt)
        for dim, name in dynamic.items():
            if name == BATCH:
                top, option = (
                    (max_batch if max_batch is not None else max(DEFAULT_MAX_BATCH, opt[dim])),
                    "max_batch",
                )
            else:
                top, option = (
                    (max_seq if max_seq is not None else max(DEFAULT_MAX_SEQ, opt[dim])),
                    "max_seq",
                )
            if top < opt[dim]:
                raise ValueError(
                    f"{option}={top} is smaller than the example's size {opt[dim]} (input "
                    f"{index}, axis {dim}); raise {option}"
                )
            low[dim], high[dim] = 1, top
        shapes.append((tuple(low), opt, tuple(high)))
    return shapes


def build_engine(
    trt: Any,
    onnx_path: Path,
    profile: Sequence[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
) -> bytes:
    """Parse ``onnx_path`` into a strongly typed network and serialize its engine.

    Args:
        trt: the imported ``tensorrt`` module.
        onnx_path: the ONNX file (QDQ nodes carry INT8, the graph's dtypes FP16/BF16).
        profile: (min, opt, max) per network input, in the network's input order.

    Raises:
        RuntimeError: the parser rejects the model, the profile does not fit its inputs, or
            the build fails; the message says which.
    """
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected the model: {errors}")
    if network.num_inputs != len(profile):
        raise RuntimeError(
            f"the network has {network.num_inputs} inputs but {len(profile)} shapes were given "
            "(the exporter dropped an unused input?)"
        )
    config = builder.create_builder_config()
    opt_profile = builder.create_optimization_profile()
    for i, (lo, opt, hi) in enumerate(profile):
        opt_profile.set_shape(network.get_input(i).name, lo, opt, hi)
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build an engine (see TensorRT's log)")
    return bytes(serialized)


class TensorRTRuntime(Runtime):
    """A TensorRT engine built from the ONNX artifact, run on torch CUDA tensors."""

    name = "tensorrt"
    # TensorRT builds float32 layers with TF32 (10 mantissa bits) unless told otherwise
    float_rtol = 1e-3
    artifact_suffixes = (".engine", ".plan", ".trt")
    cuda_only = True
    auto_rank = 40

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        super().__init__(settings, dynamic_axes)
        self._engine_path: Path | None = None
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._device: torch.device | None = None
        self._inputs: list[str] = []
        self._outputs: list[str] = []

    @classmethod
    def missing(cls) -> str | None:
        return _missing()

    @classmethod
    def version(cls) -> str | None:
        return package_version("tensorrt")

    @classmethod
    def lint(cls, model: onnx.ModelProto) -> list[str]:
        """TensorRT's parser rules checked with ``onnx`` alone (:func:`.lint.lint_for_tensorrt`)."""
        from embedl_dynamo.runtimes.tensorrt.lint import lint_for_tensorrt

        return lint_for_tensorrt(model)

    @classmethod
    def load_artifact(cls, path: Path, settings: Settings | None = None) -> TensorRTRuntime:
        """An active execution context over a serialized engine file."""
        cls.require()
        runtime = cls(settings)
        runtime._engine_path = Path(path)
        runtime.mark_loaded(runtime._engine_path)
        return runtime

    @property
    def device(self) -> torch.device:
        """The CUDA device its engine was built for (the current one before a build)."""
        return self._device if self._device is not None else target_device()

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        import tensorrt as trt

        device = target_device()
        inputs = [t.to(device) for t in example_inputs]
        # export a CPU copy with CPU inputs: weights and inputs on one device, ``gm`` untouched
        cpu_gm = copy.deepcopy(gm).cpu()
        cpu_inputs = [t.cpu() for t in example_inputs]
        axes = self.dynamic_axes or batch_axes(cpu_inputs, (), self.settings.dynamic_batch)
        exported = onnx_artifact(cpu_gm, cpu_inputs, self.settings, axes)
        onnx_path, onnx_key = exported.path, exported.key
        profile = engine_profile(
            inputs, axes, max_batch=self.settings.max_batch, max_seq=self.settings.max_seq
        )
        key = content_key(
            "trt_engine",
            onnx_key,
            trt.__version__,
            torch.cuda.get_device_name(device),
            list(torch.cuda.get_device_capability(device)),
            # min and max only: the engine a Dynamo recompile asks for with another ``opt``
            # (its new example size) is the one already built
            [[list(low), list(high)] for low, _, high in profile],
        )
        cache = ArtifactCache(self.settings.cache_dir, "trt_engine")

        def _write_engine(path: Path) -> None:
            path.write_bytes(build_engine(trt, onnx_path, profile))
            logger.info("built TensorRT engine %s", key[:16])

        engine_path, built = cache.get_or_build(key, _write_engine, ".engine")
        self.from_cache = not built
        self._engine_path = engine_path
        self.build_info = {"key": key, "artifact": str(engine_path), "onnx": str(onnx_path)}
        self._activate()
        # a copy on the GPU: the graph the eager fallback uses is not moved in place
        self.check_artifact(copy.deepcopy(gm).to(device), inputs, "TensorRT engine")

    def _activate(self) -> None:
        if self._context is not None:
            return
        import tensorrt as trt

        self._trt = trt
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = runtime.deserialize_cuda_engine(self._engine_path.read_bytes())
        if self._engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {self._engine_path}")
        self._context = self._engine.create_execution_context()
        self._device = target_device()
        self._stream = torch.cuda.Stream(self._device)
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == mode]
        self._outputs = [n for n in names if self._engine.get_tensor_mode(n) != mode]

    def _deactivate(self) -> None:
        self._context = None
        self._engine = None
        self._stream = None

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(args) != len(self._inputs):
            raise ValueError(
                f"the engine takes {len(self._inputs)} inputs {self._inputs}, got {len(args)}"
            )
        device = self._device
        keep = []
        for name, t in zip(self._inputs, args):
            want = _torch_dtype(self._trt, self._engine.get_tensor_dtype(name))
            if t.dtype != want:
                raise TypeError(f"engine input {name!r} is {want}, got a {t.dtype} tensor")
            t = t.detach().to(device).contiguous()
            keep.append(t)
            if not self._context.set_input_shape(name, tuple(t.shape)):
                raise ValueError(
                    f"input {name!r} of shape {tuple(t.shape)} is outside the engine's "
                    "optimisation profile; rebuild with a larger max_batch (batch axis) or "
                    "max_seq (other dynamic axes)"
                )
            self._context.set_tensor_address(name, t.data_ptr())
        outputs = []
        for name in self._outputs:
            shape = tuple(self._context.get_tensor_shape(name))
            dtype = _torch_dtype(self._trt, self._engine.get_tensor_dtype(name))
            out = torch.empty(shape, dtype=dtype, device=device)
            self._context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        current = torch.cuda.current_stream(device)
        self._stream.wait_stream(current)  # inputs written on torch's stream come first
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        current.wait_stream(self._stream)
        source = args[0].device if args else device
        return tuple(o.to(source) for o in outputs)
