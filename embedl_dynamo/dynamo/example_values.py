"""The example values of a saved Dynamo graph: their layouts recorded as data when it is saved,
and the values made again from them when it loads.

Our passes read each node's ``meta["example_value"]``: its shape, dtype and strides, and which
nodes share a storage or are the same tensor (an in-place op returns its input), which is how
:mod:`embedl_dynamo.graph.aliasing` sees views and writes. Running the graph on fake tensors
makes them again, but it runs every op's meta function (a batch norm's decomposition among
them), which costs a saved function's first call more than the rest of its start. So
:class:`ValueLayouts` records, besides shape and dtype, each tensor's strides and storage offset,
the earlier value whose storage it shares and the earlier value it is, and
:func:`add_example_values` builds each tensor from that record: an empty fake tensor with those
strides, a view of the value it shares a storage with, or that value itself. It runs a node on
fake tensors only where the record cannot make its value: a value that is not a tensor or a
flat sequence of them, a record from a file saved without layouts, or arguments laid out
otherwise than the saved ones (strides, storage offsets).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from embedl_dynamo.errors import SavedFunctionError

__all__ = ["DTYPES", "SPEC_KEY", "ValueLayouts", "add_example_values"]

#: torch's dtypes by the name ``str(dtype)`` gives them (``"torch.float32"``)
DTYPES = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
SPEC_KEY = "embedl_saved_spec"  # a node's saved example-value spec, until add_example_values
_WHOLE = -1  # a reference to a node's whole value, not to one item of its sequence


class ValueLayouts:
    """Each node's example value as data, in graph order: shape and dtype, and where known the
    layout that lets :func:`add_example_values` make it again without running the op."""

    def __init__(self) -> None:
        self._storages: dict[Any, list[Any]] = {}  # storage -> the first value's reference
        self._tensors: dict[int, list[Any]] = {}  # id(tensor) -> the first value's reference

    def spec(self, node: fx.Node) -> Any:
        """The spec of ``node``'s example value; raises for a symbolic size."""
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            return self._tensor_spec(value, node, [node.name, _WHOLE])
        if isinstance(value, (tuple, list)):
            # a list is made again by running its node: add_example_values makes tuples
            laid_out = isinstance(value, tuple)
            return [
                self._tensor_spec(v, node, [node.name, i], laid_out)
                if isinstance(v, torch.Tensor)
                else _plain_spec(v, node)
                for i, v in enumerate(value)
            ]
        return _plain_spec(value, node)

    def _tensor_spec(
        self, value: torch.Tensor, node: fx.Node, ref: list[Any], laid_out: bool = True
    ) -> dict[str, Any]:
        _check_static(value, node)
        spec: dict[str, Any] = {"shape": list(value.shape), "dtype": str(value.dtype)}
        try:
            storage = StorageWeakRef(value.untyped_storage())
            layout = (list(value.stride()), int(value.storage_offset()), str(value.device))
        except (NotImplementedError, RuntimeError):  # no storage (sparse, nested): run it
            return spec
        self._tensors.setdefault(id(value), ref)  # later values may share it: noted either way
        first_holder = self._storages.setdefault(storage, ref)
        if not laid_out:
            return spec
        spec.update(stride=layout[0], offset=layout[1], device=layout[2])
        if self._tensors[id(value)] is not ref:
            spec["same"] = self._tensors[id(value)]
        elif first_holder is not ref:
            spec["storage"] = first_holder
        return spec


def _check_static(value: torch.Tensor, node: fx.Node) -> None:
    if not all(isinstance(size, int) for size in value.shape):
        raise SavedFunctionError(
            f"node {node.name} has a dynamic size {tuple(value.shape)}; a saved compiled "
            "function holds static shapes: aot_compile without dynamic=True and without "
            "torch._dynamo.mark_dynamic"
        )


def _plain_spec(value: Any, node: fx.Node) -> Any:
    if isinstance(value, torch.Tensor):
        _check_static(value, node)
        return {"shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, (tuple, list)):
        return [_plain_spec(v, node) for v in value]
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise SavedFunctionError(
            f"node {node.name} is a symbolic size; a saved compiled function holds static shapes"
        )
    return None


def add_example_values(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Give each node of ``gm`` the ``example_value`` Dynamo gave it, made from its saved
    layout (see the module) or by running it on fake copies of ``args`` under ``no_grad`` (a
    ``_set_grad_enabled`` node changes nothing outside). Each value is checked against the
    spec saved with the node.

    Raises:
        SavedFunctionError: a node cannot run on fake tensors, or gives another shape or dtype
            than it did when it was saved.
    """
    mode = FakeTensorMode()
    values: dict[fx.Node, Any] = {}
    by_name: dict[str, Any] = {}
    placeholders = iter(args)
    from_layouts = True
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "output":
                break
            spec = node.meta.pop(SPEC_KEY, None)
            if node.op == "placeholder":
                value = _fake_argument(next(placeholders), mode)
                from_layouts = from_layouts and _laid_out_as(value, spec)
            else:
                value = _remade(spec, by_name, mode) if from_layouts else None
                if value is None:
                    value = _run_fake(node, values, mode)
            _check_spec(node, value, spec)
            node.meta["example_value"] = values[node] = by_name[node.name] = value


def _fake_argument(real: Any, mode: FakeTensorMode) -> Any:
    if isinstance(real, torch.Tensor):
        return mode.from_tensor(real, static_shapes=True)
    return real


def _laid_out_as(value: Any, spec: Any) -> bool:
    """Whether an argument has the strides and storage offset the saved graph was traced on
    (not for a record saved without layouts: then every node runs)."""
    if not isinstance(value, torch.Tensor):
        return True
    if not isinstance(spec, dict) or "stride" not in spec:
        return False
    layout = (list(value.stride()), int(value.storage_offset()), str(value.device))
    return layout == (spec["stride"], spec["offset"], spec["device"])


def _remade(spec: Any, by_name: dict[str, Any], mode: FakeTensorMode) -> Any:
    """The value ``spec`` lays out, or None where it cannot say (the node is then run)."""
    if isinstance(spec, dict):
        return _remade_tensor(spec, by_name, mode)
    if isinstance(spec, list) and spec and all(isinstance(s, dict) for s in spec):
        items = [_remade_tensor(s, by_name, mode) for s in spec]
        return None if any(item is None for item in items) else tuple(items)
    return None


def _remade_tensor(spec: dict[str, Any], by_name: dict[str, Any], mode: FakeTensorMode) -> Any:
    if "stride" not in spec:
        return None
    if "same" in spec:
        return _referenced(spec["same"], by_name)
    shape, stride, offset = spec["shape"], spec["stride"], spec["offset"]
    try:
        with mode:
            if "storage" in spec:
                base = _referenced(spec["storage"], by_name)
                return None if base is None else base.as_strided(shape, stride, offset)
            if offset != 0:  # a fresh storage read from an offset: nothing saved says its size
                return None
            dtype = DTYPES[spec["dtype"]]
            return torch.empty_strided(shape, stride, dtype=dtype, device=spec["device"])
    except (KeyError, RuntimeError, TypeError, ValueError):  # run the node instead
        return None


def _referenced(ref: Any, by_name: dict[str, Any]) -> Any:
    name, index = ref
    value = by_name.get(name)
    if index != _WHOLE:
        value = value[index] if isinstance(value, (tuple, list)) else None
    return value if isinstance(value, torch.Tensor) else None


def _run_fake(node: fx.Node, values: dict[fx.Node, Any], mode: FakeTensorMode) -> Any:
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
    try:
        with mode:
            if node.op == "call_method":
                return getattr(args[0], str(node.target))(*args[1:], **kwargs)
            return node.target(*args, **kwargs)
    except Exception as exc:
        raise SavedFunctionError(
            f"saved graph: node {node.name} does not run on this PyTorch ({exc}); save the "
            "compiled function again with this version"
        ) from exc


def _check_spec(node: fx.Node, value: Any, spec: Any) -> None:
    if isinstance(spec, dict):
        ok = isinstance(value, torch.Tensor) and list(value.shape) == spec.get("shape")
        if not ok or str(value.dtype) != spec.get("dtype"):
            got = (
                f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else value
            )
            raise SavedFunctionError(
                f"saved graph: node {node.name} gives {got}, saved as {tuple(spec.get('shape', ()))} "
                f"{spec.get('dtype')}: the call's arguments are not the ones it was saved for"
            )
    elif isinstance(spec, list) and isinstance(value, (tuple, list)) and len(spec) == len(value):
        for inner, inner_spec in zip(value, spec):
            _check_spec(node, inner, inner_spec)
