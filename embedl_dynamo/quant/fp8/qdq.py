"""FP8 (E4M3FN) fake quantization: the modules, and turning an INT8 fake-quant graph into FP8.

``q = saturate_e4m3(x / scale)``, ``x' = float(q) * scale``, where ``saturate_e4m3`` clips to
``[-448, 448]`` (E4M3FN's largest finite value) and rounds to the nearest E4M3 value, ties to
even: what ONNX ``QuantizeLinear`` with a ``FLOAT8E4M3FN`` zero point computes (``saturate=1``,
the default). Scales follow NVIDIA ModelOpt's convention: ``amax / 448``, per tensor for
activations and per output channel (axis 0) for weights.

The TensorRT target's INT8 fake-quant graph already holds Q/DQ at the right inputs with symmetric
scales ``amax / 127``; :func:`convert_to_fp8` swaps each of its quantizers for the FP8 one with
the same ``amax``, so FP8 is placed exactly where INT8 is (then kept only where TensorRT has FP8
kernels, see :mod:`.placement`). The FP8 modules export through
:class:`FP8QuantizeDequantize`'s ONNX symbolic as ``QuantizeLinear -> DequantizeLinear`` with a
``FLOAT8E4M3FN`` zero point 0 (opset 19 or later).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.quant.int8.insert import FakeQuantize, WeightFakeQuantize

__all__ = [
    "FP8_MAX",
    "FP8_MIN_OPSET",
    "FP8FakeQuantize",
    "FP8QuantizeDequantize",
    "FP8WeightFakeQuantize",
    "convert_to_fp8",
    "holds_fp8",
]

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_OPSET = 19  # QuantizeLinear/DequantizeLinear take float8 types from opset 19
_INT8_QMAX = 127.0  # a symmetric INT8 scale is amax / 127


class FP8QuantizeDequantize(torch.autograd.Function):
    """``x -> DequantizeLinear(QuantizeLinear(x, scale, fp8 0), scale, fp8 0)``, per tensor
    (``axis`` None) or per channel along ``axis``; straight-through gradient inside the range."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor, axis: int | None) -> torch.Tensor:
        s = scale if axis is None else scale.reshape([-1] + [1] * (x.dim() - 1 - axis))
        scaled = x / s
        ctx.save_for_backward(scaled.abs() <= FP8_MAX)
        q = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q.to(x.dtype) * s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None

    @staticmethod
    def symbolic(g: Any, x: Any, scale: Any, axis: int | None) -> Any:
        sizes = scale.type().sizes() if axis is not None else []
        zero = torch.zeros(sizes, dtype=torch.float8_e4m3fn)
        zp = g.op("Constant", value_t=zero)
        kwargs = {} if axis is None else {"axis_i": axis}
        q = g.op("QuantizeLinear", x, scale, zp, **kwargs)
        return g.op("DequantizeLinear", q, scale, zp, **kwargs)


class FP8FakeQuantize(nn.Module):
    """Per-tensor FP8 quantize-dequantize of an activation: ``scale = amax / 448``."""

    def __init__(self, amax: float) -> None:
        super().__init__()
        scale = max(float(amax), 1e-12) / FP8_MAX
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return FP8QuantizeDequantize.apply(x, self.scale, None)

    def extra_repr(self) -> str:
        return f"e4m3fn, scale={float(self.scale):.4g}"


class FP8WeightFakeQuantize(nn.Module):
    """Per-channel FP8 quantize-dequantize of a weight: ``scale[c] = amax[c] / 448`` on axis 0."""

    def __init__(self, amax: torch.Tensor, axis: int = 0) -> None:
        super().__init__()
        scale = amax.detach().float().reshape(-1).clamp(min=1e-12) / FP8_MAX
        self.register_buffer("scale", scale.clone())
        self.axis = int(axis)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return FP8QuantizeDequantize.apply(w, self.scale, self.axis)

    def extra_repr(self) -> str:
        return f"e4m3fn, channels={self.scale.numel()}, axis={self.axis}"


def _symmetric_int8(module: FakeQuantize | WeightFakeQuantize) -> bool:
    return bool((module.zero_point == 0).all()) and module.qmax == 127


def _fp8_twin(module: nn.Module) -> nn.Module | None:
    """The FP8 quantizer with ``module``'s amax, or None for a module that is not a quantizer.

    Raises:
        ValueError: an INT8 quantizer that is not symmetric (no amax to carry over).
    """
    if not isinstance(module, (FakeQuantize, WeightFakeQuantize)):
        return None
    if not _symmetric_int8(module):
        raise ValueError(
            "FP8 needs the target's symmetric INT8 placement (zero point 0, scale amax/127, as "
            "the tensorrt target's); use backend='tensorrt' with precision='fp8'"
        )
    amax = module.scale * _INT8_QMAX
    if isinstance(module, WeightFakeQuantize):
        return FP8WeightFakeQuantize(amax, module.axis)
    return FP8FakeQuantize(float(amax))


def convert_to_fp8(gm: fx.GraphModule) -> int:
    """Replace every INT8 fake-quant module of ``gm`` (values and weights) by its FP8 twin with
    the same calibrated ``amax``, in place.

    Returns:
        The number of quantizers converted.

    Raises:
        ValueError: a quantizer is not symmetric INT8 (the target is not TensorRT-like).
    """
    swaps = []
    for name, module in gm.named_modules():
        twin = _fp8_twin(module)
        if twin is not None:
            swaps.append((name, twin))
    for name, twin in swaps:
        parent_name, _, attr = name.rpartition(".")
        setattr(gm.get_submodule(parent_name) if parent_name else gm, attr, twin)
    if swaps:
        gm.recompile()
    return len(swaps)


def holds_fp8(module: nn.Module) -> bool:
    """Whether ``module`` (a graph) holds an FP8 quantizer, so its ONNX needs opset >= 19."""
    return any(isinstance(m, (FP8FakeQuantize, FP8WeightFakeQuantize)) for m in module.modules())
