"""New weights into an exported ONNX graph: each initializer from the transformed graph's
constant it was exported from, without exporting again.

The TorchScript exporter names an initializer after the constant of the exported module it
holds (``gm.conv_bn_relu_layer1_0_conv1.bias``: the module is :mod:`.export`'s wrapper, whose
graph is ``gm``). :func:`refit_initializers` finds, for a transformed graph's constants that
its weights decide (replayed from a :class:`~embedl_dynamo.graph.weight_recipe.WeightRecipe`),
the initializer of each, and computes its new value:

* ``gm.<name>``: the constant itself (same shape and dtype, or the refit is refused);
* ``gm.<name>_int8``: a quantized weight folded to int8 as the file was written
  (:func:`~.int8_weights.fold_int8_weights`, the very same code, on its new scale and zero
  point);
* the zero point of a weight's ``QuantizeLinear``/``DequantizeLinear``, which the exporter folds
  into a constant of its own (cast to int8/uint8): from the quantizer's ``zero_point``.

It refuses (ValueError naming why) whatever it cannot prove is computed as a new export would
compute it: a weight-derived constant that is no initializer of its own (the exporter merged it
with an equal one, or folded it into another constant; a linear weight the exporter transposed
is taken where the export recorded it, :mod:`.constant_views`), an initializer of floating
type that no constant names and that holds more than one value, unless the export recorded
the constants the exporter computed it from and none of them changes
(:mod:`.initializer_sources`: a rotary table is kept as it is), a zero point two quantizers
share that would now differ, a constant the recipe could not replay (tainted), or a constant
no weight decides that the exporter may have merged into a weight-derived initializer (equal
bytes). The caller then builds anew.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from embedl_dynamo.graph.weight_recipe import digest_kind, tensor_digest
from embedl_dynamo.onnx.constant_views import (
    EXPORTED_PREFIX,
    INT8_SUFFIX,
    folded_constants,
    transposed_constants,
)
from embedl_dynamo.onnx.initializer_sources import initializer_sources
from embedl_dynamo.onnx.int8_weights import fold_int8_weights

__all__ = ["EXPORTED_PREFIX", "refit_initializers", "replace_initializers"]

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


def _array(proto: Any) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(proto)


def _torch_dtype(data_type: int) -> torch.dtype | None:
    """The torch dtype of an ONNX tensor type (None: one a weight never has)."""
    from onnx import TensorProto as T

    types = {T.FLOAT: torch.float32, T.FLOAT16: torch.float16, T.BFLOAT16: torch.bfloat16}
    types.update({T.DOUBLE: torch.float64, T.INT8: torch.int8, T.UINT8: torch.uint8})
    types.update({T.INT16: torch.int16, T.INT32: torch.int32, T.INT64: torch.int64})
    return {**types, T.BOOL: torch.bool}.get(data_type)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as a numpy array (bfloat16, which numpy lacks, as its uint16 bits)."""
    tensor = tensor.detach().contiguous().cpu()
    return (tensor.view(torch.uint16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _old_tensor(proto: Any) -> torch.Tensor:
    """An initializer's value as a tensor of its own dtype."""
    data = bytearray(_array(proto).tobytes())
    dtype = _torch_dtype(proto.data_type) or torch.uint8
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.reshape(list(proto.dims))


def _check_spec(name: str, proto: Any, value: torch.Tensor) -> None:
    dtype = _torch_dtype(proto.data_type)
    if list(proto.dims) != list(value.shape) or dtype != value.dtype:
        raise ValueError(
            f"initializer {name} is {dtype}{list(proto.dims)} in the file, the new weights give "
            f"{value.dtype}{list(value.shape)}"
        )


class _Constants:
    """The model's initializers and the ``Identity`` nodes the exporter turned equal ones into
    (``onnx::QuantizeLinear_308 = Identity(onnx::QuantizeLinear_302)``): a name, and the
    initializer it reads."""

    def __init__(self, model: Any) -> None:
        self.inits = {i.name: i for i in model.graph.initializer}
        self.root: dict[str, str] = {name: name for name in self.inits}
        for node in model.graph.node:  # topological: a chain resolves as it is met
            if node.op_type == "Identity" and node.input[0] in self.root:
                self.root[node.output[0]] = self.root[node.input[0]]

    def __contains__(self, name: str) -> bool:
        return name in self.root

    def proto(self, name: str) -> Any:
        return self.inits[self.root[name]]

    def old(self, name: str) -> np.ndarray:
        return _array(self.proto(name))


def refit_initializers(
    model: Any,
    derived: Mapping[str, torch.Tensor],
    independent: Mapping[str, str],
    tainted: Mapping[str, str],
) -> dict[str, np.ndarray]:
    """The new value of every constant of ``model`` (an ``onnx.ModelProto`` with its weights
    loaded) that the new weights change, by name: an initializer, or the output of an
    ``Identity`` of one, which :func:`replace_initializers` makes an initializer of its own.

    Args:
        model: the exported model; not modified.
        derived: the transformed graph's weight-derived constants, by name, new values.
        independent: the digests of its constants no weight decides, by name.
        tainted: its constants the weights decide but no replay computes, and why.

    Raises:
        ValueError: the initializers cannot be proved to be what a new export would write.
    """
    if tainted:
        name, why = next(iter(tainted.items()))
        raise ValueError(f"constant {name} cannot be recomputed from the weights ({why})")
    constants = _Constants(model)
    transposed, folded_away = transposed_constants(model), folded_constants(model)
    new: dict[str, np.ndarray] = {}
    folded: dict[str, np.ndarray] = {}
    zero_points: dict[str, torch.Tensor] = {}
    for fqn, tensor in derived.items():
        name = EXPORTED_PREFIX + fqn
        for view in transposed.get(fqn, ()):  # the exporter's folded W.t(): its own initializer
            _check_spec(view, constants.proto(view), tensor.t())
            new[view] = _as_numpy(tensor.t())
        if name in constants:
            _check_spec(name, constants.proto(name), tensor)
            new[name] = _as_numpy(tensor)
        elif fqn in transposed or folded_away.get(fqn) == tensor_digest(tensor):
            continue  # all its initializers set, or unchanged: nothing folded from it changes
        elif name + INT8_SUFFIX in constants:
            folded[name + INT8_SUFFIX] = _as_numpy(tensor)
        elif fqn.endswith(".zero_point"):
            zero_points[fqn] = tensor
        else:
            raise ValueError(
                f"weight-derived constant {fqn} is not an initializer of the file (folded by "
                "the exporter into another constant)"
            )
    new.update(_zero_points(model, zero_points, constants))
    new.update(_folded(model, folded, constants, new))
    unchanged = _Unchanged(derived, independent)
    _check_unmapped(constants, new, independent, initializer_sources(model), unchanged)
    new.update(_kept_apart(constants, new))
    _check_not_merged(constants, new, independent)
    return new


def _kept_apart(constants: _Constants, new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The names the exporter merged into an initializer the new weights change that keep their
    old value (a constant no weight decides, equal to the weight it was merged into)."""
    kept = {}
    for name, root in constants.root.items():
        if name != root and name not in new and root in new:
            kept[name] = constants.old(name)
    return kept


def _zero_points(
    model: Any, zero_points: dict[str, torch.Tensor], constants: _Constants
) -> dict[str, np.ndarray]:
    """The new zero-point initializers of the weights' Q/DQ nodes, found through their scale
    (``gm.<q>.scale`` reads ``<q>.zero_point``)."""
    found: dict[str, np.ndarray] = {}
    used = set()
    for node in model.graph.node:
        if node.op_type not in _QDQ or len(node.input) < 3:
            continue
        scale, zp_name = node.input[1], node.input[2]
        if not scale.startswith(EXPORTED_PREFIX) or not scale.endswith(".scale"):
            continue
        fqn = scale[len(EXPORTED_PREFIX) : -len("scale")] + "zero_point"
        if fqn not in zero_points or zp_name not in constants:
            continue
        used.add(fqn)
        old = constants.old(zp_name)
        value = _as_numpy(zero_points[fqn]).astype(old.dtype).reshape(old.shape)
        if zp_name in found and not np.array_equal(found[zp_name], value):
            raise ValueError(f"zero point {zp_name} is read by quantizers that now differ")
        found[zp_name] = value
    missing = sorted(set(zero_points) - used)
    if missing:
        raise ValueError(f"weight-derived zero point {missing[0]} is read by no Q/DQ node")
    return found


def _folded(
    model: Any,
    folded: dict[str, np.ndarray],
    constants: _Constants,
    new: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The int8 initializers of the quantized weights, folded from the new float weights with
    their (new) scales and zero points by the code that folded them at export."""
    from onnx import helper, numpy_helper

    readers = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    result = {}
    for name, weight in folded.items():
        node = readers.get(name)
        if node is None or len(node.input) < 3:
            raise ValueError(f"int8 weight {name} is read by no DequantizeLinear with a zero point")
        source = name[: -len(INT8_SUFFIX)]
        values = {source: weight}
        for other in node.input[1:3]:
            values[other] = new[other] if other in new else constants.old(other)
        axis = [a for a in node.attribute if a.name == "axis"]
        quantize = helper.make_node("QuantizeLinear", [source, *node.input[1:3]], ["q"])
        quantize.attribute.extend(axis)
        graph = helper.make_graph(
            [quantize, helper.make_node("DequantizeLinear", ["q", *node.input[1:3]], ["y"])],
            "fold",
            [],
            [helper.make_tensor_value_info("y", 1, None)],
            [numpy_helper.from_array(v, k) for k, v in values.items()],
        )
        mini = helper.make_model(graph)
        if fold_int8_weights(mini) != 1:
            raise ValueError(f"int8 weight {name} could not be folded again")
        result[name] = _array(next(i for i in mini.graph.initializer if i.name == name))
        _check_spec(name, constants.proto(name), torch.from_numpy(np.array(result[name])))
    return result


class _Unchanged:
    """Whether a constant of the transformed graph is, with the new weights, what it was at
    export: its digest then (:mod:`.initializer_sources`) equal to its digest now."""

    def __init__(self, derived: Mapping[str, torch.Tensor], independent: Mapping[str, str]):
        self.derived, self.independent = derived, independent
        self.digests: dict[str, str | None] = {}

    def changed(self, sources: Mapping[str, str | None] | None) -> str | None:
        """The first of ``sources`` (constant -> digest at export) that is not unchanged
        (all of them when unknown, None), or None."""
        if sources is None:
            return "constants the export did not record"
        for fqn, digest in sources.items():
            if fqn not in self.digests:
                tensor = self.derived.get(fqn)
                now = self.independent.get(fqn) if tensor is None else tensor_digest(tensor)
                self.digests[fqn] = now
            if digest is None or self.digests[fqn] != digest:
                return fqn
        return None


def _floats(proto: Any) -> int:
    """How many values an initializer of floating type holds (0 for another type)."""
    from onnx import helper

    dtype = helper.tensor_dtype_to_np_dtype(proto.data_type)
    count = int(np.prod(proto.dims)) if proto.dims else 1
    return count if np.issubdtype(dtype, np.floating) else 0


def _check_unmapped(
    constants: _Constants,
    new: dict[str, np.ndarray],
    independent: Mapping[str, str],
    sources: Mapping[str, Mapping[str, str | None] | None],
    unchanged: _Unchanged,
) -> None:
    """Every initializer the new weights do not set must be one no weight decides: a constant
    of the graph no weight decides, an integer (a shape, an index), a float scalar, or one the
    exporter computed from constants all unchanged (a rotary embedding's table, kept)."""
    for name, proto in constants.inits.items():
        if name in new:
            continue
        if name.startswith(EXPORTED_PREFIX):
            if name[len(EXPORTED_PREFIX) :] in independent:
                continue
            raise ValueError(f"initializer {name} names no constant of the transformed graph")
        _check_computed(name, _floats(proto), sources, unchanged)
    for name, root in constants.root.items():  # one the exporter kept as equal to another
        if name != root and name not in new and not name.startswith(EXPORTED_PREFIX):
            _check_computed(name, _floats(constants.proto(name)), sources, unchanged)


def _check_computed(
    name: str,
    count: int,
    sources: Mapping[str, Mapping[str, str | None] | None],
    unchanged: _Unchanged,
) -> None:
    """An initializer of ``count`` floats no constant names, kept: refused unless the export
    recorded the constants it was computed from, all unchanged (or it holds at most one)."""
    if count <= 1:
        return
    if name not in sources:
        raise ValueError(
            f"initializer {name} ({count} values) was computed by the ONNX exporter and may "
            "depend on a weight"
        )
    changed = unchanged.changed(sources[name])
    if changed is not None:
        raise ValueError(
            f"initializer {name} ({count} values) was computed by the ONNX exporter from "
            f"{changed}, which the new weights change"
        )


def _check_not_merged(
    constants: _Constants, new: dict[str, np.ndarray], independent: Mapping[str, str]
) -> None:
    """A constant no weight decides that is no name of the file at all may have been folded
    into one the new weights change: refused where such an initializer held its bytes."""
    kinds = {}  # dtype|shape only: an initializer is hashed where a constant's kind fits
    for name in new:
        proto = constants.proto(name)
        dtype = _torch_dtype(proto.data_type)
        kinds[name] = f"{str(dtype).split('.')[-1]}|{list(proto.dims)}"
    for fqn, digest in independent.items():
        if EXPORTED_PREFIX + fqn in constants:
            continue
        for name, kind in kinds.items():
            if kind != digest_kind(digest):
                continue
            if tensor_digest(_old_tensor(constants.proto(name))) == digest:
                raise ValueError(
                    f"constant {fqn} equals initializer {name}, which the new weights change "
                    "(the exporter may have merged them)"
                )


def replace_initializers(model: Any, values: Mapping[str, np.ndarray]) -> None:
    """Set the constants of ``model`` named in ``values`` to those bytes, in place (inline
    data, each keeping its ONNX type): an initializer, or the output of an ``Identity`` node,
    which becomes an initializer of its own."""
    constants = _Constants(model)
    for proto in model.graph.initializer:
        if proto.name in values:
            _set(proto, proto.name, proto.data_type, values[proto.name])
    done = {proto.name for proto in model.graph.initializer}
    for node in list(model.graph.node):
        name = node.output[0] if node.output else None
        if node.op_type == "Identity" and name in values and name not in done:
            model.graph.node.remove(node)
            _set(model.graph.initializer.add(), name, constants.proto(name).data_type, values[name])


def _set(proto: Any, name: str, data_type: int, value: np.ndarray) -> None:
    value = np.ascontiguousarray(value)
    proto.Clear()
    proto.name, proto.data_type = name, data_type
    proto.dims.extend(value.shape)
    proto.raw_data = value.tobytes()
