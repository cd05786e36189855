"""What :func:`~embedl_dynamo.deploy.refit.refit` checks before a refitted file replaces the
old one: that it loads and runs on the runtime it is meant for (:func:`runs`), and for an INT8
file that its kept activation scales still fit the new weights (:func:`check_int8`).

An INT8 file is compared with its own graph in float (:func:`float_graph`): each
``QuantizeLinear -> DequantizeLinear`` pair on an activation taken out, each int8 weight's
``DequantizeLinear`` replaced by the new float weight it was folded from. That is the
transformed model before quantization, with the new weights: the float reference a build
judges an INT8 artifact against. The verdict is the one ``torch.compile`` applies
(:func:`~embedl_dynamo.tuning.judge.check_precision_outputs`): on every batch, cosine to the
float outputs at least ``accuracy_budget``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedl_dynamo.errors import ExportError, OutputMismatchError, VerificationError, error_line
from embedl_dynamo.onnx.external_data import save_model_file
from embedl_dynamo.onnx.refit_weights import EXPORTED_PREFIX
from embedl_dynamo.quant.int8.calibrate import as_batches
from embedl_dynamo.runtimes.registry import runtime_classes
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import check_precision_outputs

__all__ = ["CHECKED_BATCHES", "check_int8", "float_graph", "runs"]

#: at most this many calibration batches are run through both files
CHECKED_BATCHES = 8
_INT8 = "_int8"


def _loaded(path: Path, runtime: str) -> Any:
    cls = runtime_classes().get(runtime)
    if cls is None or not cls.is_available():
        cls = runtime_classes()["onnxruntime"]
    return cls.load_artifact(path, Settings())


def _outputs(runtime: Any, batches: list[tuple[torch.Tensor, ...]]) -> list[list[torch.Tensor]]:
    return [[t.clone() for t in runtime.infer(*batch)] for batch in batches]


def runs(path: Path, runtime: str, calibration_data: Iterable[Any] | None) -> None:
    """Load ``path`` on ``runtime`` (ONNX Runtime where it is not installed) and, with
    calibration data, run its first batch (VerificationError if either fails)."""
    try:
        loaded = _loaded(path, runtime)
        if calibration_data is not None:
            _outputs(loaded, as_batches(calibration_data)[:1])
    except Exception as exc:
        raise VerificationError(
            f"the refitted {path.name} does not run: {error_line(exc)}"
        ) from exc
    loaded.deactivate()


def check_int8(
    path: Path,
    runtime: str,
    constants: Mapping[str, torch.Tensor],
    calibration_data: Iterable[Any],
    budget: float,
) -> float:
    """The worst cosine of the refitted INT8 file at ``path`` to its float graph with the new
    weights (``constants``: the transformed model's, by name) on the calibration batches.

    Raises:
        VerificationError: below ``budget`` (the message says how far, and the fix).
        ExportError: the file's float graph cannot be built to compare with.
    """
    import onnx

    batches = as_batches(calibration_data)[:CHECKED_BATCHES]
    with tempfile.TemporaryDirectory(prefix=".refit-float-", dir=path.parent) as tmp:
        reference = Path(tmp) / path.name
        save_model_file(float_graph(onnx.load(str(path)), constants), reference)
        float_outputs = _outputs(_loaded(reference, runtime), batches)
    quantized = _loaded(path, runtime)
    try:
        return check_precision_outputs(
            float_outputs, _outputs(quantized, batches), budget, f"the refitted {path.name}"
        )
    except OutputMismatchError as exc:
        raise VerificationError(
            f"{error_line(exc, with_type=False)} with the INT8 scales of its export; export "
            "the model again with calibration_data to calibrate them anew (the file is "
            "unchanged)"
        ) from exc
    finally:
        quantized.deactivate()


def float_graph(model: Any, constants: Mapping[str, torch.Tensor]) -> Any:
    """``model`` (an INT8 ``ModelProto``) without its quantization, in place: activations'
    Q/DQ pairs taken out, each int8 weight's ``DequantizeLinear`` replaced by its float weight
    from ``constants`` (ExportError where a Q/DQ node is neither)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    quantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    nodes, weights = [], []
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            continue  # its DequantizeLinear reads its input instead
        if node.op_type != "DequantizeLinear":
            nodes.append(node)
            continue
        source = node.input[0]
        fqn = source[len(EXPORTED_PREFIX) : -len(_INT8)] if source.endswith(_INT8) else None
        if source in quantized:  # an activation's pair: the value itself
            nodes.append(helper.make_node("Identity", [quantized[source]], list(node.output)))
        elif fqn is not None and fqn in constants:  # an int8 weight: its new float weight
            value = np.ascontiguousarray(constants[fqn].detach().cpu().numpy())
            weights.append(numpy_helper.from_array(value, node.output[0]))
        else:
            raise ExportError(
                f"cannot check the refitted file in float: {source} is "
                "dequantized but is neither a weight nor an activation"
            )
    if any(name in quantized for node in nodes for name in node.input):
        raise ExportError(
            "cannot check the refitted file in float: a QuantizeLinear output "
            "is read by another node than its DequantizeLinear"
        )
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(weights)
    read = {name for node in graph.node for name in node.input}
    for proto in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(proto)
    return model
