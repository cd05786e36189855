"""The pipeline's stage of the weight-only precisions (``int8_weight_only``,
``int4_weight_only``): the spec from the settings and the target, each linear's weights in
integers (:mod:`embedl_dynamo.quant.weight_only.linear`), then the layers that read one input stored
as one (:mod:`embedl_dynamo.quant.weight_only.merge`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from torch import fx

from embedl_dynamo.quant.weight_only.codes import WeightOnlySpec
from embedl_dynamo.quant.weight_only.linear import WEIGHT_ONLY_BITS, weight_only_graph
from embedl_dynamo.quant.weight_only.merge import merge_sibling_layers
from embedl_dynamo.settings import Settings

__all__ = ["weight_only_stage"]


def _spec_for(settings: Settings, backend: Any) -> WeightOnlySpec:
    name = settings.precision.name
    if name not in WEIGHT_ONLY_BITS:
        raise ValueError(
            f"weight_only_stage: precision {name!r} is not weight-only; valid: "
            f"{', '.join(WEIGHT_ONLY_BITS)}"
        )
    symmetric = settings.weight_only_symmetric
    if symmetric is None:  # TensorRT's quantization is symmetric; NNCF/torchao default: asym
        symmetric = getattr(backend, "name", "") == "tensorrt"
    return WeightOnlySpec(WEIGHT_ONLY_BITS[name], settings.weight_only_group_size, symmetric)


def _tables_kept(backend: Any) -> str | None:
    """Why the target keeps embedding tables float (None: they become int8). TensorRT reads
    int8 constants through ``DequantizeLinear`` (its lint's rule), not as a ``Gather``'s table."""
    if getattr(backend, "name", "") == "tensorrt":
        return "the tensorrt target reads int8 constants only through DequantizeLinear"
    return None


def weight_only_stage(
    gm: fx.GraphModule, example_inputs: Sequence[Any], backend: Any, settings: Settings
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The pipeline's stage of ``int8_weight_only`` / ``int4_weight_only``.

    Args:
        gm: the fused, canonical float graph; not modified.
        example_inputs: one input per placeholder (the int4 accuracy check runs on them).
        backend: the target (``tensorrt`` makes the default symmetric).
        settings: ``precision``, ``weight_only_group_size``, ``weight_only_symmetric`` and
            ``accuracy_budget``.

    Returns:
        ``(graph, report entries)``: ``layers`` (id, precision, reason per linear),
        ``weight_only`` (bits, group size, symmetric, ``kept_int8`` by the budget, ``cosine``,
        ``merged``: the groups of layers stored as one) and ``weight_only_s``.
    """
    start = time.perf_counter()
    spec = _spec_for(settings, backend)
    model, report = weight_only_graph(
        gm, list(example_inputs), spec, settings.accuracy_budget, _tables_kept(backend)
    )
    report["merged"] = merge_sibling_layers(model)
    layers = report.pop("layers")
    entries = {"layers": layers, "weight_only": report}
    return model, {**entries, "weight_only_s": round(time.perf_counter() - start, 4)}
