"""The ``torch_tensorrt`` runtime: hand the transformed graph to Torch-TensorRT.

Through its public ahead-of-time API: ``torch.export.export`` the GraphModule (batch dim
dynamic when ``dynamic_batch``) and ``torch_tensorrt.dynamo.compile(exported_program,
arg_inputs=..., min_block_size=..., cache_built_engines=True, reuse_cached_engines=True,
engine_cache_dir=<cache>/torch_tensorrt)``, so Torch-TensorRT's own engine cache lives in our
cache directory. Ops Torch-TensorRT cannot convert stay in PyTorch (its partitioner decides).

``torch_tensorrt`` is imported lazily; :meth:`TorchTensorRTRuntime.missing` names what is
absent: the package, a CUDA device, a version that pairs with this torch.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence

import torch
from torch import fx

from embedl_dynamo.runtimes.artifacts import count_build
from embedl_dynamo.runtimes.base import Runtime, check_outputs

__all__ = ["TorchTensorRTRuntime"]

logger = logging.getLogger(__name__)


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


class TorchTensorRTRuntime(Runtime):
    """Torch-TensorRT's ``dynamo.compile`` on the exported transformed graph."""

    name = "torch_tensorrt"

    @classmethod
    def missing(cls) -> str | None:
        return _missing()

    @property
    def is_jit(self) -> bool:
        return False

    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        import torch_tensorrt

        device = torch.device("cuda", torch.cuda.current_device())
        gm = gm.to(device)
        inputs = tuple(t.to(device) for t in example_inputs)
        dynamic_shapes = None
        if self.settings.dynamic_batch:
            batch = torch.export.Dim("batch", min=1, max=max(8, 2 * inputs[0].shape[0]))
            dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in inputs)
        program = torch.export.export(gm, inputs, dynamic_shapes=dynamic_shapes)
        cache_dir = self.settings.cache_dir / "torch_tensorrt"
        self._module = torch_tensorrt.dynamo.compile(
            program,
            arg_inputs=inputs,
            min_block_size=max(1, self.settings.min_subgraph_size),
            cache_built_engines=True,
            reuse_cached_engines=True,
            engine_cache_dir=str(cache_dir),
        )
        count_build("torch_tensorrt")
        self.build_info = {"artifact": str(cache_dir)}
        with torch.no_grad():
            expected = gm(*inputs)
        expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
        check_outputs(expected, self._infer(inputs), "Torch-TensorRT module", rtol=1e-2)

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            out = self._module(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
