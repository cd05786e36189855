"""Reference outputs in IEEE float32: TensorFloat-32 off while they are computed.

On NVIDIA GPUs since Ampere, PyTorch runs float32 convolutions in TF32 by default
(``torch.backends.cudnn.allow_tf32``), and matmuls too where the caller allowed it
(``torch.backends.cuda.matmul.allow_tf32``, ``torch.set_float32_matmul_precision("high")``).
TF32 keeps 10 mantissa bits, so a CNN's outputs move by several 1e-4 of their scale. The
outputs an artifact is judged against must be the float32 it promises: in TF32, a correct
float32 file (ONNX Runtime's CPU kernels) fails the float bound, and the bound would have to
grow until it hid real errors. The caller's flags are restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["exact_float32"]


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Run the block with TF32 off for cuDNN convolutions and cuBLAS matmuls (a no-op in a
    process that never initialised CUDA: no tensor can be on a GPU there)."""
    if not torch.cuda.is_initialized():
        yield
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved
