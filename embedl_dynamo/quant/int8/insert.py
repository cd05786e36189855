"""Insert observers (for calibration) and fake-quant QDQ (for export) at the planned positions.

A quantized value becomes ``torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin,
qmax)`` and a weight ``torch.fake_quantize_per_channel_affine(w, scale, zero_point, axis, qmin,
qmax)``: both export to ONNX ``QuantizeLinear`` -> ``DequantizeLinear`` (either exporter) and
are differentiable with a straight-through estimator, which QAT relies on.

Weight scales are computed from the weights here (min/max per output channel) and frozen as
buffers: TensorRT's explicit quantization needs constant weight scales. Fused modules get their
weight quantizer as a ``torch.nn.utils.parametrize`` parametrization, so the QDQ sits on the
weight inside the traced graph without changing the module class.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.nn.utils import parametrize

from embedl_dynamo.graph.nodes import PATH_KEY, constant_value, module_path
from embedl_dynamo.quant.int8.observers import Calibrator, make_calibrator, scale_zero_point
from embedl_dynamo.quant.int8.placement import Placement, WeightPoint
from embedl_dynamo.quant.int8.spec import QuantizationConfig, QuantizationSpec
from embedl_dynamo.rewrite.qdq import Role

__all__ = [
    "FakeQuantize",
    "Observer",
    "WeightFakeQuantize",
    "insert_fake_quant",
    "insert_observers",
    "weight_qparams",
]


class Observer(nn.Module):
    """Identity that feeds every value it sees to its calibrator."""

    def __init__(self, calibrator: Calibrator) -> None:
        super().__init__()
        self.calibrator = calibrator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calibrator.collect(x)
        return x


class FakeQuantize(nn.Module):
    """Per-tensor quantize-dequantize with a frozen (or, for QAT, learnable-by-STE) range."""

    def __init__(self, scale: float, zero_point: int, qmin: int, qmax: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(float(scale), dtype=torch.float32))
        self.register_buffer("zero_point", torch.tensor(int(zero_point), dtype=torch.int32))
        self.qmin, self.qmax = int(qmin), int(qmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fake_quantize_per_tensor_affine(
            x, self.scale, self.zero_point, self.qmin, self.qmax
        )

    def extra_repr(self) -> str:
        return f"scale={float(self.scale):.4g}, zero_point={int(self.zero_point)}, [{self.qmin}, {self.qmax}]"


class WeightFakeQuantize(nn.Module):
    """Per-channel quantize-dequantize of a weight with scales frozen from the weight."""

    def __init__(
        self, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, qmin: int, qmax: int
    ) -> None:
        super().__init__()
        self.register_buffer("scale", scale.float().reshape(-1).clone())
        self.register_buffer("zero_point", zero_point.to(torch.int32).reshape(-1).clone())
        # narrow range [-127, 127]: symmetric scales (amax / 127) never produce -128, so the
        # exportable int8 grid [-128, 127] computes the same values (ONNX has no narrow range)
        qmin = -128 if (qmin, qmax) == (-127, 127) else qmin
        self.axis, self.qmin, self.qmax = int(axis), int(qmin), int(qmax)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return torch.fake_quantize_per_channel_affine(
            w, self.scale, self.zero_point, self.axis, self.qmin, self.qmax
        )

    def extra_repr(self) -> str:
        return f"channels={self.scale.numel()}, axis={self.axis}, [{self.qmin}, {self.qmax}]"


def weight_qparams(
    weight: torch.Tensor, spec: QuantizationSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen ``(scale, zero_point)`` of a weight under ``spec`` (per channel on ``spec.axis``)."""
    w = weight.detach().float()
    if spec.per_channel:
        axis = spec.axis % w.dim()
        flat = w.transpose(0, axis).reshape(w.shape[axis], -1)
        lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    else:  # one range, repeated per output channel so one quantizer form serves both
        lo = w.min().expand(w.shape[0])
        hi = w.max().expand(w.shape[0])
    return scale_zero_point(spec, lo, hi)


def _unique_name(gm: fx.GraphModule, base: str) -> str:
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "q"
    name, index = base, 1
    while hasattr(gm, name):
        index += 1
        name = f"{base}_{index}"
    return name


def _insertion_point(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    if node.op == "placeholder":
        return [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    return node


def _wrap_value(gm: fx.GraphModule, node: fx.Node, module: nn.Module, prefix: str) -> fx.Node:
    """Route every use of ``node`` through ``module``."""
    name = _unique_name(gm, f"{prefix}_{node.name}")
    gm.add_module(name, module)
    with gm.graph.inserting_after(_insertion_point(gm, node)):
        new = gm.graph.call_module(name, (node,))
    new.meta[PATH_KEY] = module_path(node)
    for key in ("val", "example_value", "tensor_meta"):
        if key in node.meta:
            new.meta[key] = node.meta[key]
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    return new


def _node_spec(config: QuantizationConfig, role: Role) -> QuantizationSpec:
    spec = config.spec(role)
    if spec is None:
        raise ValueError(f"quantization config {config.name!r} has no spec for role {role.value!r}")
    return spec


def insert_observers(
    gm: fx.GraphModule, placement: Placement, config: QuantizationConfig
) -> tuple[fx.GraphModule, dict[str, Calibrator]]:
    """A copy of ``gm`` with an :class:`Observer` after every planned activation.

    Returns:
        ``(observed_gm, {node name: calibrator})``.
    """
    gm = copy.deepcopy(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    calibrators: dict[str, Calibrator] = {}
    for name, role in placement.activations.items():
        spec = _node_spec(config, role)
        calibrator = make_calibrator(spec, name=module_path(nodes[name]) or name)
        calibrators[name] = calibrator
        _wrap_value(gm, nodes[name], Observer(calibrator), "observer")
    gm.graph.lint()
    gm.recompile()
    return gm, calibrators


def _quantize_weight(
    gm: fx.GraphModule, nodes: dict[str, fx.Node], point: WeightPoint, config: QuantizationConfig
) -> dict[str, Any]:
    spec = _node_spec(config, point.role)
    if point.module:
        module = gm.get_submodule(point.module)
        weight = getattr(module, point.param)
        scale, zp = weight_qparams(weight, spec)
        quantizer = WeightFakeQuantize(scale, zp, spec.axis or 0, spec.qmin, spec.qmax)
        if not parametrize.is_parametrized(module, point.param):
            parametrize.register_parametrization(module, point.param, quantizer, unsafe=True)
    else:
        consumer = nodes[point.consumer]
        weight_node = next(
            n
            for n in consumer.all_input_nodes
            if n.op == "get_attr" and str(n.target) == point.target
        )
        weight = constant_value(gm, weight_node)
        scale, zp = weight_qparams(weight, spec)
        quantizer = WeightFakeQuantize(scale, zp, spec.axis or 0, spec.qmin, spec.qmax)
        name = _unique_name(gm, f"wq_{point.target}")
        gm.add_module(name, quantizer)
        with gm.graph.inserting_after(weight_node):
            new = gm.graph.call_module(name, (weight_node,))
        new.meta[PATH_KEY] = module_path(consumer)
        consumer.replace_input_with(weight_node, new)
    return {
        "dtype": spec.dtype,
        "axis": spec.axis,
        "scale": scale.tolist(),
        "zero_point": zp.tolist(),
    }


def insert_fake_quant(
    gm: fx.GraphModule,
    placement: Placement,
    config: QuantizationConfig,
    ranges: Mapping[str, Mapping[str, Any]],
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """A copy of ``gm`` with fake-quant QDQ at every planned position.

    Args:
        gm: the fused graph (not modified).
        placement: where QDQ goes.
        config: the target's specs per role.
        ranges: node name -> ``{"scale": float, "zero_point": int}`` from calibration.

    Returns:
        ``(quantized_gm, {weight key: frozen scales})``.
    """
    gm = copy.deepcopy(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    missing = sorted(set(placement.activations) - set(ranges))
    if missing:
        raise KeyError(f"no calibrated range for {missing}; calibrate before inserting QDQ")
    for name, role in placement.activations.items():
        r = ranges[name]
        spec = _node_spec(config, role).for_range(float(r["min"]))
        fq = FakeQuantize(r["scale"], r["zero_point"], spec.qmin, spec.qmax)
        _wrap_value(gm, nodes[name], fq, "fq")
    weights = {
        key: _quantize_weight(gm, nodes, point, config) for key, point in placement.weights.items()
    }
    gm.graph.lint()
    gm.recompile()
    return gm, weights
