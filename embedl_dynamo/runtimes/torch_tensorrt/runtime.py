"""The ``torch_tensorrt`` runtime: hand the transformed graph to Torch-TensorRT's Dynamo backend.

We are already inside a Dynamo backend, so the graph goes to Torch-TensorRT the way Dynamo
backends compose: ``torch._dynamo.lookup_backend("torch_tensorrt")(gm, inputs, options=...)``.
``torch.export.export`` is *not* called here: inside a backend it fails (``Guard failed on the
same frame it was created``, ``ConstraintViolationError``), whatever the device.

Options passed (Torch-TensorRT 2.13 names):

* ``pass_through_build_failures=True``: a failed engine build raises, so our fallback runs the
  *original* graph and the report says why (Torch-TensorRT would otherwise return the graph
  unchanged, silently);
* ``cache_built_engines`` / ``reuse_cached_engines`` with ``engine_cache_dir`` in our cache
  directory, and ``immutable_weights=False``: Torch-TensorRT's engine cache engages only with
  refittable engines;
* ``min_block_size`` from ``min_subgraph_size``.

Engines are built for the shapes they see; a new input shape builds one more module (up to
:data:`MAX_SHAPES`, then calls with other shapes raise and run in PyTorch with one warning).

INT8: Torch-TensorRT converts no ``aten.fake_quantize_*`` op. A fake-quant graph is rewritten to
``tensorrt::quantize_op``
(:func:`~embedl_dynamo.quant.int8.torch_tensorrt_qdq.to_torch_tensorrt_qdq`) when NVIDIA
ModelOpt has registered that op; without it the build raises a clear error and the float
artifact runs instead (see ``dynamo.compile``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import package_version
from embedl_dynamo.quant.fp8.qdq import holds_fp8
from embedl_dynamo.quant.int8.insert import FakeQuantize
from embedl_dynamo.quant.int8.torch_tensorrt_qdq import has_quantize_op, to_torch_tensorrt_qdq
from embedl_dynamo.runtimes.base import Runtime, target_device

__all__ = [
    "MAX_SHAPES",
    "TorchTensorRTRuntime",
    "compile_options",
    "torch_tensorrt_backend",
]

logger = logging.getLogger(__name__)

MAX_SHAPES = 8


@functools.lru_cache(maxsize=1)
def _missing() -> str | None:
    torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if importlib.util.find_spec("torch_tensorrt") is None:
        return f"the torch-tensorrt package is not installed (pip install 'torch-tensorrt=={torch_mm}.*')"
    if not torch.cuda.is_available():
        return "no CUDA device is available (torch.cuda.is_available() is False)"
    try:
        import torch_tensorrt
    except Exception as exc:  # e.g. libnvinfer.so missing
        return f"torch_tensorrt fails to import: {exc} (it needs TensorRT's libraries)"
    version = ".".join(str(torch_tensorrt.__version__).split(".")[:2])
    if version != torch_mm:
        return f"torch-tensorrt {torch_tensorrt.__version__} does not pair with torch {torch.__version__}; install torch-tensorrt=={torch_mm}.*"
    return None


def torch_tensorrt_backend() -> Callable[..., Any]:
    """Torch-TensorRT's registered Dynamo backend (importing it registers the name)."""
    import torch_tensorrt  # noqa: F401

    return torch._dynamo.lookup_backend("torch_tensorrt")


def compile_options(cache_dir: str, min_block_size: int) -> dict[str, Any]:
    """The ``options`` given to Torch-TensorRT's backend (see the module docstring)."""
    return {
        "pass_through_build_failures": True,
        "min_block_size": max(1, min_block_size),
        "cache_built_engines": True,
        "reuse_cached_engines": True,
        "engine_cache_dir": cache_dir,
        "immutable_weights": False,
    }


def _is_fake_quant(gm: fx.GraphModule) -> bool:
    return any(isinstance(m, FakeQuantize) for m in gm.modules())


class TorchTensorRTRuntime(Runtime):
    """Torch-TensorRT's Dynamo backend on the transformed graph, one module per input shape."""

    name = "torch_tensorrt"
    # TensorRT builds float32 layers with TF32 (10 mantissa bits) unless told otherwise
    float_rtol = 1e-3
    cuda_only = True
    auto_rank = 30

    is_jit = True  # an engine per input shape, compiled inside the first infer of that shape

    @property
    def device(self) -> torch.device:
        """The CUDA device its module runs on (the current one before a build)."""
        return getattr(self, "_device", None) or target_device()

    @classmethod
    def missing(cls) -> str | None:
        return _missing()

    @classmethod
    def version(cls) -> str | None:
        return package_version("torch-tensorrt", "torch_tensorrt")

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        if _is_fake_quant(gm) or holds_fp8(gm):
            if not holds_fp8(gm) and not has_quantize_op():  # FP8: its own error below
                raise RuntimeError(
                    "INT8 on the torch_tensorrt runtime needs tensorrt::quantize_op, which NVIDIA "
                    "ModelOpt registers: pip install nvidia-modelopt, or use runtime='tensorrt' "
                    "(explicit Q/DQ through ONNX)"
                )
            gm = to_torch_tensorrt_qdq(gm)
        self._device = target_device()
        self._gm = gm.to(self._device)
        self._modules: dict[tuple, Callable[..., Any]] = {}
        self._cache_dir = self.settings.cache_dir / "torch_tensorrt"
        inputs = tuple(t.to(self._device) for t in example_inputs)
        self.check_artifact(self._gm, inputs, "Torch-TensorRT module")
        self.build_info = {"artifact": str(self._cache_dir), "shapes": len(self._modules)}

    def _module_for(self, inputs: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        module = self._modules.get(key)
        if module is None:
            if len(self._modules) >= MAX_SHAPES:
                raise RuntimeError(
                    f"Torch-TensorRT built engines for {MAX_SHAPES} input shapes already; "
                    f"shape {[list(s) for s, _ in key]} runs in PyTorch"
                )
            options = compile_options(str(self._cache_dir), self.settings.min_subgraph_size)
            module = torch_tensorrt_backend()(self._gm, list(inputs), options=options)
            self._modules[key] = module
        return module

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        device = args[0].device if args else self._device
        inputs = tuple(t.to(self._device) for t in args)
        with torch.no_grad():
            out = self._module_for(inputs)(*inputs)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return tuple(o.to(device) for o in outs)
