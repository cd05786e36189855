"""The peers our benchmarks compare with, built the way their users build them.

* :func:`openvino_peer`: ``ov.convert_model(model, example_input=...)`` compiled on the CPU with
  ``INFERENCE_PRECISION_HINT=f32`` (the float peer), or ``bf16``, which OpenVINO picks by
  itself on a CPU with AVX512_BF16 or AMX, as this one has (the peer of our ``bf16``); with
  ``int8``, NNCF's ``quantize`` on the same calibration batches first (``ModelType.TRANSFORMER``
  for transformers, as NNCF documents);
* :func:`inductor_peer`: ``torch.compile`` with ``torch._inductor.config.freezing = True``.

Each returns the call to time (built, not yet called).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["inductor_peer", "openvino_peer"]


def openvino_peer(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calibration: Sequence[Sequence[torch.Tensor]],
    int8: bool,
    transformer: bool = False,
    precision_hint: str | None = "f32",
) -> Callable[[], torch.Tensor]:
    """OpenVINO's own conversion of ``model`` (NNCF INT8 with ``int8``), compiled with
    ``INFERENCE_PRECISION_HINT=precision_hint`` (``bf16``: what OpenVINO picks by itself on a
    CPU with AVX512_BF16 or AMX; None: OpenVINO's default hints); returns output 0."""
    import openvino as ov

    with torch.no_grad():
        ov_model = ov.convert_model(model, example_input=tuple(inputs))
    if int8:
        import nncf

        data = nncf.Dataset([tuple(t.numpy() for t in batch) for batch in calibration])
        kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
        ov_model = nncf.quantize(ov_model, data, **kwargs)
    hint = {"INFERENCE_PRECISION_HINT": precision_hint} if precision_hint else {}
    compiled = ov.Core().compile_model(ov_model, "CPU", hint)
    request = compiled.create_infer_request()
    feeds = [t.numpy() for t in inputs]

    def run() -> torch.Tensor:
        request.infer(feeds)
        return torch.from_numpy(np.array(request.get_output_tensor(0).data))

    return run


def inductor_peer(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable[[], object]:
    """``torch.compile(model)`` with inductor's freezing on."""
    torch._inductor.config.freezing = True
    compiled = torch.compile(model, backend="inductor")
    return lambda: compiled(*inputs)
