"""Quantization-aware training: the fake-quant model made trainable.

:func:`embedl_dynamo.prepare_qat` fuses and calibrates like :func:`embedl_dynamo.quantize`
(BatchNorm is folded into the convolutions, i.e. frozen at its running statistics), then
:func:`make_trainable` makes the weights trainable.
``torch.fake_quantize_*`` pass gradients straight through inside the quantization range (the
straight-through estimator) and zero outside it; weight and activation scales stay frozen at
their calibrated values, so the exported model keeps constant scales.
"""

from __future__ import annotations

from torch import fx, nn

__all__ = ["make_trainable"]


def make_trainable(qat: fx.GraphModule) -> fx.GraphModule:
    """Make a fake-quant graph trainable in place: weights require grad, BatchNorm stays frozen.

    Args:
        qat: a fake-quant GraphModule (``quantize``'s result).

    Returns:
        ``qat`` in train mode; fine-tune it with any optimizer, then ``eval()``.
    """
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
