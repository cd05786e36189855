"""Quantization-aware training: the fake-quant model made trainable.

:func:`prepare_qat` fuses and calibrates like :func:`~.api.quantize` (BatchNorm is folded into
the convolutions, i.e. frozen at its running statistics), then makes the weights trainable.
``torch.fake_quantize_*`` pass gradients straight through inside the quantization range (the
straight-through estimator) and zero outside it; weight and activation scales stay frozen at
their calibrated values, so the exported model keeps constant scales.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import fx, nn

from embedl_dynamo.quant.api import quantize
from embedl_dynamo.quant.spec import QuantizationConfig

__all__ = ["prepare_qat"]


def prepare_qat(
    model: nn.Module,
    args: Sequence[Any],
    config: QuantizationConfig | None = None,
    forward_loop: Callable[[nn.Module], Any] | None = None,
    *,
    calibration_data: Iterable[Any] | None = None,
    backend: Any = None,
    observer: str | None = None,
) -> fx.GraphModule:
    """A trainable fake-quant copy of ``model`` (``model`` itself is not modified).

    Args:
        model, args, config, forward_loop, calibration_data, backend, observer: as for
            :func:`~.api.quantize`.

    Returns:
        A GraphModule in train mode whose float weights (the originals behind the weight
        quantizers) require grad; fine-tune it with any optimizer, then ``eval()``.
    """
    qat = quantize(
        model, args, config, forward_loop, calibration_data=calibration_data, backend=backend,
        observer=observer,
    )  # fmt: skip
    for param in qat.parameters():
        param.requires_grad_(True)
    for buf in qat.buffers():
        buf.requires_grad_(False)
    # BatchNorm is folded (frozen) by the fusions; any unfused BatchNorm keeps running stats.
    for module in qat.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
    qat.train()
    _freeze_batchnorm_in_train(qat)
    return qat


def _freeze_batchnorm_in_train(gm: fx.GraphModule) -> None:
    """Make ``train()`` leave BatchNorm layers in eval mode (statistics frozen)."""
    original_train = gm.train

    def train(mode: bool = True) -> fx.GraphModule:
        original_train(mode)
        for module in gm.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return gm

    gm.train = train  # type: ignore[method-assign]
