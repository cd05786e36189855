"""The QDQ form Torch-TensorRT's converters accept: ``torch.ops.tensorrt.quantize_op``.

Torch-TensorRT (v2.13) converts no ``aten.fake_quantize_*`` op; its INT8 path consumes
``tensorrt::quantize_op(input, amax, num_bits, exponent_bits, unsigned, narrow_range)``, an op
that NVIDIA ModelOpt defines. It is symmetric only (``scale = amax / 127``) and per-channel only
on axis 0 of weights. :func:`to_torch_tensorrt_qdq` rewrites our fake-quant graph into that form:
each :class:`~.insert.FakeQuantize` / :class:`~.insert.WeightFakeQuantize` becomes one
``quantize_op`` call with ``amax = scale * 127``. Asymmetric (uint8) quantizers cannot be
expressed and raise, naming the tensor.
"""

from __future__ import annotations

import copy

import torch
from torch import fx
from torch.nn.utils import parametrize

from embedl_dynamo.quant.fp8.qdq import holds_fp8
from embedl_dynamo.quant.int8.insert import FakeQuantize, WeightFakeQuantize

__all__ = ["has_quantize_op", "is_available", "to_torch_tensorrt_qdq"]


def is_available() -> bool:
    """Whether ``torch_tensorrt`` imports (it needs TensorRT and CUDA libraries)."""
    try:
        import torch_tensorrt  # noqa: F401
    except Exception:
        return False
    return True


def has_quantize_op() -> bool:
    """Whether ``torch.ops.tensorrt.quantize_op`` is registered (ModelOpt imported)."""
    try:
        import modelopt.torch.quantization  # noqa: F401  (registers the op)
    except Exception:
        pass
    return hasattr(torch.ops, "tensorrt") and hasattr(torch.ops.tensorrt, "quantize_op")


def _amax(scale: torch.Tensor, zero_point: torch.Tensor, name: str) -> torch.Tensor:
    if bool((zero_point != 0).any()):
        raise ValueError(
            f"quantizer {name!r} is asymmetric (zero point != 0): Torch-TensorRT's quantize_op is "
            "symmetric only; quantize for the 'tensorrt' backend (symmetric int8)"
        )
    return (scale.detach().float() * 127.0).clone()


def to_torch_tensorrt_qdq(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a fake-quant graph whose quantizers are ``tensorrt::quantize_op`` calls.

    Raises:
        RuntimeError: ``torch.ops.tensorrt.quantize_op`` is not registered (install
            ``nvidia-modelopt`` / ``torch-tensorrt``).
        ValueError: a quantizer is asymmetric, or FP8 (per-channel FP8 weights have no
            Torch-TensorRT converter).
    """
    if holds_fp8(gm):
        raise ValueError(
            "FP8 on the torch_tensorrt runtime: Torch-TensorRT's quantize converter takes FP8 per "
            "tensor only and the FP8 weights are per channel; use runtime='tensorrt' (ONNX)"
        )
    if not has_quantize_op():
        raise RuntimeError(
            "torch.ops.tensorrt.quantize_op is not registered: install nvidia-modelopt "
            "(it defines the op) and torch-tensorrt"
        )
    op = torch.ops.tensorrt.quantize_op
    gm = copy.deepcopy(gm)
    # weights: unwrap parametrizations into explicit get_attr -> quantize_op nodes
    for name, module in list(gm.named_modules()):
        if not parametrize.is_parametrized(module, "weight"):
            continue
        quantizer = module.parametrizations.weight[0]
        if isinstance(quantizer, WeightFakeQuantize):
            amax = _amax(quantizer.scale, quantizer.zero_point, f"{name}.weight")
            weight = module.parametrizations.weight.original.detach()
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
            shape = [-1] + [1] * (weight.dim() - 1)
            with torch.no_grad():
                module.weight.copy_(op(weight, amax.reshape(shape), 8, 0, False, True))
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        module = gm.get_submodule(str(node.target))
        if isinstance(module, FakeQuantize):
            amax = _amax(module.scale, module.zero_point, node.name)
            attr = f"{node.target}_amax"
            gm.register_buffer(attr, amax)
            with gm.graph.inserting_before(node):
                amax_node = gm.graph.get_attr(attr)
                new = gm.graph.call_function(op, (node.args[0], amax_node, 8, 0, False, False))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm
