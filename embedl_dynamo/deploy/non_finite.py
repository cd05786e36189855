"""Which loaded files would answer NaN or infinite inputs otherwise than PyTorch, and the
per-call guard that refuses such calls.

PyTorch propagates NaN and infinities; some files, on some runtimes, do not:

* an op whose conformance row lists a difference on them for the runtime
  (:func:`~embedl_dynamo.runtimes.conformance.needs_finite_inputs`: OpenVINO's ``ReLU(NaN)``
  and ``Clamp(NaN)`` give a number; a convolution or pooling window spreads or drops a NaN
  otherwise than PyTorch's on both CPU runtimes). The export records, per CPU runtime, why
  (the sidecar's ``guards.non_finite_inputs``, :mod:`~embedl_dynamo.deploy.export_guards`), as
  the compiled path guards the same ops per call; the fix names a runtime that computes the
  file's ops on them as PyTorch does, where one does. A file exported before the sidecar
  recorded it is refused on OpenVINO, as before;
* a file that quantizes activations (INT8, ``mixed``, FP8 Q/DQ) turns them into finite codes
  at its first QuantizeLinear on every runtime (the compiled path refuses such calls to its
  INT8 subgraphs too, and runs them in PyTorch); the fix is a float export.

There is no PyTorch graph behind a loaded file to run such a call instead (the compiled path
runs it in PyTorch), and a second runtime's session would double the memory and the start of
every file for calls that are rare. So the call is refused: :func:`non_finite_risk` decides
once per file, :func:`check_finite_inputs` checks each call's float inputs in one pass each
(numpy's ``min`` and ``max`` on the CPU, NaN propagating through both, no copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from embedl_dynamo.runtimes.finite import all_finite

__all__ = ["NonFiniteRisk", "non_finite_risk", "check_finite_inputs"]


class NonFiniteRisk:
    """Why a loaded file's answer to NaN or infinite inputs would not be PyTorch's, and the fix.

    Attributes:
        reason: what the file's runtime does with them.
        fix: what to do instead (a call with finite inputs always runs).
    """

    def __init__(self, reason: str, fix: str) -> None:
        self.reason = reason
        self.fix = fix

    def __repr__(self) -> str:
        return f"NonFiniteRisk({self.reason!r})"


def non_finite_risk(runtime: str, sidecar: Mapping[str, Any]) -> NonFiniteRisk | None:
    """Whether calls with NaN or infinite float inputs are refused for a file that ``runtime``
    runs and whose export sidecar is ``sidecar`` (None: they run, as PyTorch computes them).

    Args:
        runtime: the runtime's name (``openvino``, ``onnxruntime``, ``tensorrt``).
        sidecar: the export sidecar (empty where there is none).
    """
    if sidecar.get("quantized") is True:
        precision = sidecar.get("precision") or "int8"
        return NonFiniteRisk(
            f"the file quantizes activations ({precision}), which turns them into finite codes "
            "on every runtime",
            "pass finite inputs, or export the model in float (precision='fp32') for inputs "
            "that hold them",
        )
    recorded = (sidecar.get("guards") or {}).get("non_finite_inputs")
    if isinstance(recorded, Mapping) and runtime in recorded:
        return _recorded_risk(runtime, recorded)
    if runtime == "openvino":  # a file exported before the sidecar recorded its guards
        return NonFiniteRisk(
            "OpenVINO computes them otherwise than PyTorch (ReLU and Clamp of NaN give numbers, "
            "MaxPool drops NaN), so its answer could be finite where PyTorch's is not",
            "load it on ONNX Runtime, which keeps them as PyTorch does: "
            "load(path, runtime='onnxruntime'); or pass finite inputs",
        )
    return None


def _recorded_risk(runtime: str, recorded: Mapping[str, str | None]) -> NonFiniteRisk | None:
    """The risk the export recorded for ``runtime`` (its reason, from the conformance table),
    with a runtime the table says answers this file's NaN and infinities as PyTorch does as
    the fix, where there is one."""
    reason = recorded[runtime]
    if reason is None:
        return None
    exact = [name for name, why in recorded.items() if why is None and name != runtime]
    if exact:
        fix = (
            f"load it on {exact[0]}, which computes them as PyTorch does for this file: "
            f"load(path, runtime={exact[0]!r}); or pass finite inputs"
        )
    else:
        fix = (
            "pass finite inputs (no CPU runtime computes this file's ops on them as PyTorch does; "
            "torch.compile runs such calls in PyTorch)"
        )
    return NonFiniteRisk(reason, fix)


def check_finite_inputs(
    name: str, input_names: Sequence[str], risk: NonFiniteRisk, inputs: Sequence[torch.Tensor]
) -> None:
    """Refuse a call whose float inputs hold NaN or an infinity.

    Args:
        name: the file's name, for the message.
        input_names: the file's input names.
        risk: why such a call is refused (:func:`non_finite_risk`).
        inputs: the call's tensors.

    Raises:
        ValueError: the first input holding one, the reason and the fix.
    """
    for index, tensor in enumerate(inputs):
        if tensor.is_floating_point() and not all_finite(tensor):
            label = input_names[index] if index < len(input_names) else index
            raise ValueError(
                f"{name}: input {index} ({label}) holds NaN or infinity: {risk.reason}; {risk.fix}"
            )
