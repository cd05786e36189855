"""The peers our benchmarks compare with, built the way their users build them.

* :func:`openvino_peers` (:func:`openvino_peer` for one hint): ``ov.convert_model(model,
  example_input=...)`` compiled on the CPU with ``INFERENCE_PRECISION_HINT=f32`` (the float
  peer), or with OpenVINO's default hints, which pick bf16 by themselves on a CPU with
  AVX512_BF16 or AMX, as this one has (the peer of our ``bf16``); with ``int8``, NNCF's
  ``quantize`` on the same calibration batches first (``ModelType.TRANSFORMER`` for
  transformers, as NNCF documents); one conversion serves several hints;
* :func:`inductor_peer`: ``torch.compile`` with ``torch._inductor.config.freezing = True``.

Each returns the call to time (built, not yet called).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["inductor_peer", "openvino_peer", "openvino_peers"]


def openvino_peers(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calibration: Sequence[Sequence[torch.Tensor]],
    int8: bool,
    transformer: bool = False,
    precision_hints: Sequence[str | None] = ("f32",),
) -> dict[str | None, Callable[[], torch.Tensor]]:
    """OpenVINO's own conversion of ``model`` (NNCF INT8 with ``int8``), converted (and
    quantized) once and compiled once per hint of ``precision_hints``, each with
    ``INFERENCE_PRECISION_HINT`` set to it (``bf16``: what OpenVINO picks by itself on a CPU
    with AVX512_BF16 or AMX; None: OpenVINO's default hints).

    Returns:
        hint -> the call to time, which returns output 0.
    """
    import openvino as ov

    with torch.no_grad():
        ov_model = ov.convert_model(model, example_input=tuple(inputs))
    if int8:
        import nncf

        data = nncf.Dataset([tuple(t.numpy() for t in batch) for batch in calibration])
        kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
        ov_model = nncf.quantize(ov_model, data, **kwargs)
    feeds = [t.numpy() for t in inputs]
    core = ov.Core()

    def peer(hint: str | None) -> Callable[[], torch.Tensor]:
        config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
        request = core.compile_model(ov_model, "CPU", config).create_infer_request()

        def run() -> torch.Tensor:
            request.infer(feeds)
            return torch.from_numpy(np.array(request.get_output_tensor(0).data))

        return run

    return {hint: peer(hint) for hint in precision_hints}


def openvino_peer(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calibration: Sequence[Sequence[torch.Tensor]],
    int8: bool,
    transformer: bool = False,
    precision_hint: str | None = "f32",
) -> Callable[[], torch.Tensor]:
    """:func:`openvino_peers` with one hint: the call to time, which returns output 0."""
    peers = openvino_peers(model, inputs, calibration, int8, transformer, (precision_hint,))
    return peers[precision_hint]


def inductor_peer(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable[[], object]:
    """``torch.compile(model)`` with inductor's freezing on."""
    torch._inductor.config.freezing = True
    compiled = torch.compile(model, backend="inductor")
    return lambda: compiled(*inputs)
