"""OpenVINO's own conversion and NNCF's INT8 of it, built the way their users build them.

``ov.convert_model(model, example_input=...)`` compiled on the CPU with an
``INFERENCE_PRECISION_HINT`` (``ov_f32``: f32; ``ov_bf16``: bf16; ``ov_default``: none, so
OpenVINO picks, bf16 on a CPU with AVX512_BF16 or AMX: the peer of our ``bf16``); with
``nncf_int8*``, NNCF's ``quantize`` of that conversion on the case's calibration batches first
(``ModelType.TRANSFORMER`` for transformers, as NNCF documents), compiled with the default
hints (what an NNCF user gets: INT8 with bf16 elsewhere) or a hint. A case converts (and
quantizes) once; each hint compiles that model again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from bench.variants import Built, Case, memo

__all__ = ["build", "openvino_model", "request_call"]

# variant -> (int8, hint)
VARIANTS = {
    "ov_f32": (False, "f32"),
    "ov_default": (False, None),
    "ov_bf16": (False, "bf16"),
    "nncf_int8": (True, None),
    "nncf_int8_f32": (True, "f32"),
    "nncf_int8_bf16": (True, "bf16"),
}


def openvino_model(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calibration: Sequence[Sequence[torch.Tensor]] = (),
    int8: bool = False,
    transformer: bool = False,
):
    """``ov.convert_model`` of ``model`` (NNCF's INT8 of it with ``int8``)."""
    import openvino as ov

    with torch.no_grad():
        ov_model = ov.convert_model(model, example_input=tuple(inputs))
    if int8:
        import nncf

        data = nncf.Dataset([tuple(t.numpy() for t in batch) for batch in calibration])
        kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
        ov_model = nncf.quantize(ov_model, data, **kwargs)
    return ov_model


def request_call(ov_model, inputs: Sequence[torch.Tensor], hint: str | None) -> Callable:
    """The converted model compiled on the CPU with ``hint``: a call returning output 0."""
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
    request = ov.Core().compile_model(ov_model, "CPU", config).create_infer_request()
    feeds = [t.numpy() for t in inputs]

    def run() -> torch.Tensor:
        request.infer(feeds)
        return torch.from_numpy(np.array(request.get_output_tensor(0).data))

    return run


def _tool(int8: bool) -> str:
    from importlib.metadata import version

    tool = f"OpenVINO {version('openvino')}"
    return f"NNCF {version('nncf')} + {tool}" if int8 else tool


def build(case: Case, name: str) -> Built:
    """One of :data:`VARIANTS` for ``case`` (its conversion shared with the others)."""
    int8, hint = VARIANTS[name]
    transformer = case.family == "transformer"
    key = "nncf" if int8 else "openvino"
    ov_model = memo(
        case,
        key,
        lambda: openvino_model(case.model, case.inputs, case.calibration, int8, transformer),
    )
    return Built(request_call(ov_model, case.inputs, hint), tool=_tool(int8))
