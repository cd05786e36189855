"""Fitting ONNX models to the installed ONNX Runtime's opsets and kernels.

onnx releases lead onnxruntime's: a model may import an opset onnxruntime does not run yet, or an
op version it has no kernel for even though it runs that opset (1.32 runs opset 28 without a
QuantizeLinear-28 kernel). Both are lowered with ``onnx.version_converter``, the IR version set to
the oldest one that allows the new opset, and each step logged; ops that did not change between
the two opsets are untouched.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import onnx
from onnx import helper

from embedl_dynamo.runtimes.onnxruntime.session import create_session

__all__ = [
    "convert_opset",
    "default_opset",
    "fit_to_onnxruntime",
    "fitted_session",
    "holds_bfloat16",
    "model_at_opset",
    "names_missing_kernel",
    "ort_max_opset",
]

logger = logging.getLogger(__name__)


@functools.cache
def ort_max_opset() -> int:
    """The newest default-domain opset the installed onnxruntime officially runs.

    ORT trails onnx by a release or two; it is asked (a one-node model per candidate opset,
    newest first) rather than hard-coded, so an upgrade of either package needs no edit here.
    """
    import onnxruntime as ort

    node = helper.make_node("Relu", ["x"], ["y"])
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    options = ort.SessionOptions()
    options.log_severity_level = 4
    for opset in range(onnx.defs.onnx_opset_version(), 6, -1):
        model = model_at_opset(helper.make_graph([node], "probe", [x], [y]), opset)
        try:
            create_session(model.SerializeToString(), ["CPUExecutionProvider"], options=options)
        except Exception:  # too new for this onnxruntime
            continue
        return opset
    raise RuntimeError("onnxruntime runs no default-domain opset >= 7; reinstall onnxruntime")


def fit_to_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a down-converted copy when its default opset is newer than onnxruntime runs.

    Args:
        model: the model (not modified).

    Returns:
        The same object when it already fits, else a converted copy.

    Raises:
        ValueError: onnx's version converter cannot express the model at the older opset.
    """
    target = ort_max_opset()
    if default_opset(model) <= target:
        return model
    return convert_opset(model, target, f"onnxruntime runs opsets up to {target}")


# ONNX Runtime's message for an op version it declares no kernel for.
_MISSING_KERNEL = re.compile(
    r"(?:Could not find an implementation|Failed to find kernel) for (\w+)\((\d+)\)"
)


def names_missing_kernel(exc: BaseException) -> re.Match[str] | None:
    """The ``(op, version)`` match when ``exc`` is ONNX Runtime's "no kernel for op version"."""
    return _MISSING_KERNEL.search(str(exc))


def fitted_session(model: onnx.ModelProto, providers: list[str], options: Any) -> Any:
    """A session for ``model``, lowered below any op version ONNX Runtime has no kernel for.

    Each retry targets the opset just under the missing kernel's version, so it ends after at
    most one step per op version; an error that names no missing kernel is raised unchanged.
    """
    model = fit_to_onnxruntime(model)
    while True:
        try:
            return create_session(model.SerializeToString(), providers, options=options)
        except Exception as exc:  # ORT's NotImplemented is not importable as a stable name
            found = names_missing_kernel(exc)
            current = default_opset(model)
            if found is None or not 7 <= int(found.group(2)) - 1 < current:
                raise
            if holds_bfloat16(model):  # no bf16 kernel (CPU MatMul): no opset lowers a type
                raise
            op, version = found.group(1), int(found.group(2))
            model = convert_opset(model, version - 1, f"onnxruntime has no {op}-{version} kernel")


def holds_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether ``model`` computes in bfloat16 (a bf16 weight, graph value or cast): ONNX
    Runtime's CPU provider then lacks kernels for it, whatever the opset."""
    bf16 = onnx.TensorProto.BFLOAT16
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    return (
        any(t.data_type == bf16 for t in graph.initializer)
        or any(v.type.tensor_type.elem_type == bf16 for v in values)
        or any(
            n.op_type == "Cast" and any(a.name == "to" and a.i == bf16 for a in n.attribute)
            for n in graph.node
        )
    )


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) domain ``model`` imports; 0 when it imports none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def convert_opset(model: onnx.ModelProto, target: int, why: str) -> onnx.ModelProto:
    """``model`` converted to opset ``target`` with onnx's version converter, IR lowered to fit."""
    from onnx import version_converter

    current = default_opset(model)
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises RuntimeError/ValueError per adapter
        raise ValueError(
            f"the model uses opset {current} but {why}, and onnx's version converter cannot "
            f"lower it to opset {target}: {exc}. Export with opset={target}."
        ) from exc
    converted.ir_version = helper.find_min_ir_version_for(list(converted.opset_import))
    logger.info("converted the model from opset %d to %d: %s", current, target, why)
    return converted


def model_at_opset(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    """A model importing ``opset``, with the oldest IR version that allows it."""
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model
