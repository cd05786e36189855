"""Which loaded files would answer NaN or infinite inputs with finite numbers, and the per-call
guard that refuses such calls.

PyTorch propagates NaN and infinities; some files, on some runtimes, do not:

* OpenVINO computes several ops otherwise on them (``ReLU(NaN)`` and ``Clamp(NaN)`` give a
  number, ``MaxPool`` drops a NaN; the conformance table's rows and Differences,
  :mod:`embedl_dynamo.runtimes.conformance`), so an openvino-target file running on OpenVINO
  can answer a NaN pixel with a finite class score. ONNX Runtime keeps NaN and infinities
  where PyTorch has them on the same float file (the exact forms every export writes,
  :mod:`embedl_dynamo.graph.exact_ops`), so the fix is ``load(path, runtime="onnxruntime")``.
* A file that quantizes activations (INT8, ``mixed``, FP8 Q/DQ) turns them into finite codes
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
    if runtime == "openvino":
        return NonFiniteRisk(
            "OpenVINO computes them otherwise than PyTorch (ReLU and Clamp of NaN give numbers, "
            "MaxPool drops NaN), so its answer could be finite where PyTorch's is not",
            "load it on ONNX Runtime, which keeps them as PyTorch does: "
            "load(path, runtime='onnxruntime'); or pass finite inputs",
        )
    return None


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
