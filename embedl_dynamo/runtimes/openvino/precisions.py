"""The precisions of OpenVINO's runtime model in this package's names, and which of its nodes
compute nothing: how a built model reports what it runs in."""

from __future__ import annotations

from collections import Counter

__all__ = ["INTEGER_TYPES", "NOT_COMPUTE", "PRECISION_NAME", "PRECISION_RANK", "integer_layers"]

# the runtime model's integer precisions (u4/i4: int4 weight-only compressed layers) by the
# build_info entry that counts them
INTEGER_TYPES = {"int8_layers": ("u8", "i8"), "int4_layers": ("u4", "i4")}
# the runtime model's precisions, in this package's names, and their order (lowest first)
PRECISION_NAME = {
    "u4": "int4",
    "i4": "int4",
    "u8": "int8",
    "i8": "int8",
    "bf16": "bf16",
    "f16": "fp16",
    "f32": "fp32",
}
PRECISION_RANK = {"int4": -1, "int8": 0, "fp16": 1, "bf16": 1, "fp32": 2}
# runtime-model nodes that compute nothing (data, layout, shape bookkeeping)
NOT_COMPUTE = frozenset(
    {
        "Const",
        "Input",
        "Output",
        "Parameter",
        "Result",
        "Reshape",
        "Reorder",
        "Transpose",
        "ShapeOf",
        "Gather",
        "Concatenation",
        "Broadcast",
        "Convert",
        "StridedSlice",
        "Split",
    }
)


def integer_layers(precisions: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``{"int8_layers": {layer type: count}, "int4_layers": ...}`` of the runtime model's
    integer layers (``precisions``: :meth:`~.runtime.OpenVINORuntime.layer_precisions`); only the
    entries that have any."""
    counted = {}
    for entry, types in INTEGER_TYPES.items():
        kinds = Counter()
        for (kind, precision), count in precisions.items():
            if precision in types:
                kinds[kind] += count
        if kinds:
            counted[entry] = dict(sorted(kinds.items()))
    return counted
