"""Store quantized weights as int8: ``QuantizeLinear(W_float) -> DequantizeLinear`` on a constant
weight becomes an int8 initializer followed by ``DequantizeLinear``.

The fake-quant graph exports every weight as float with a Q/DQ pair, so an INT8 file is as large
as a float one and every runtime re-quantizes the weights when it loads. ONNX Runtime's own
quantizer and ModelOpt (``dq_only``) write the folded form instead; TensorRT and ONNX Runtime
both read it. The integers are exactly what ``QuantizeLinear`` would compute:
``clip(round_half_even(W / scale) + zero_point)``, per tensor or per channel along ``axis``, so
the outputs do not change and the file is about 4x smaller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from embedl_dynamo.onnx.external_data import data_path, external_locations, save_model_file

__all__ = ["fold_int8_weights", "graph_constants", "store_weights_as_int8"]

_RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def store_weights_as_int8(path: Path) -> int:
    """Fold every ``QuantizeLinear`` of a constant in the ONNX file at ``path``, in place.

    A file whose weights an exporter wrote elsewhere than one :func:`~.external_data.data_path`
    (a file per tensor, named after it) is written again with them all in that one file.

    Returns:
        The number of weights folded (0 leaves a file without external data untouched).
    """
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    stale = external_locations(model)
    if stale:
        onnx.load_external_data_for_model(model, str(path.parent))
    folded = fold_int8_weights(model)
    if folded or (stale and stale != {data_path(path).name}):
        save_model_file(model, path, stale)
    return folded


def fold_int8_weights(model: Any) -> int:
    """Fold every ``QuantizeLinear`` of a constant in the ``onnx.ModelProto``, in place.

    Returns:
        The number of weights folded (0 leaves the model untouched).
    """
    from onnx import numpy_helper

    graph = model.graph
    if not any(node.op_type == "QuantizeLinear" for node in graph.node):
        return 0  # a float model: nothing to fold, no need to decode every weight
    constants = graph_constants(graph)
    folded, dropped = 0, []
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or len(node.input) < 3:
            continue
        weight, scale, zero = (constants.get(n) for n in node.input[:3])
        if weight is None or scale is None or zero is None or zero.dtype not in _RANGES:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and scale.size > 1:
            shape = [1] * weight.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        low, high = _RANGES[zero.dtype]
        q = np.clip(np.rint(weight / scale) + zero.astype(np.int32), low, high).astype(zero.dtype)
        name = f"{node.input[0]}_int8"
        graph.initializer.append(numpy_helper.from_array(q, name))
        for other in graph.node:  # the DequantizeLinear readers take the integers directly
            for i, value in enumerate(other.input):
                if value == node.output[0]:
                    other.input[i] = name
        graph.node.remove(node)
        dropped.append(node.input[0])
        folded += 1
    if not folded:
        return 0
    still_read = {n for node in graph.node for n in node.input}
    keep = [i for i in graph.initializer if i.name in still_read or i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return folded


def graph_constants(graph: Any) -> dict[str, Any]:
    """Every constant value of an ONNX graph by name (numpy): initializers, ``Constant``
    outputs and ``Identity`` of a constant."""
    from onnx import numpy_helper

    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:  # topological order: Identity of a constant is a constant too
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Identity" and node.input[0] in constants:
            constants[node.output[0]] = constants[node.input[0]]
    return constants
