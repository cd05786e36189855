"""A Dynamo graph as JSON data, and back: what a saved compiled function carries instead of a
pickle.

PyTorch's ``aot_compile`` saves Dynamo's bytecode and guards, and hands a backend's saved
callable nothing but its own bytes when it loads (``deserialize_compile_artifacts(data)``): the
graph Dynamo traced is not given back. :mod:`embedl_dynamo.dynamo.saved_function` therefore
keeps the graph itself, as data: one record per node (its op, name, target, arguments and the
metadata our passes read), never code or a pickle.

* **Targets** are named, never stored as objects: an ATen op by its name (``aten.add.Tensor``),
  a function by the module it is found in among :data:`MODULES` (``torch``, its ``nn.functional``
  and C namespaces, ``operator``, ``math``, a few builtins) and its name, a method by its name.
  Loading looks names up in those modules only, so a record cannot call anything else.
* **Arguments** are JSON with tags for what JSON lacks: ``{"node": name}``, tuples, slices,
  dtypes, devices, non-finite floats. Anything else refuses the graph, naming the node.
* **Metadata**: each placeholder's static-input mark, each node's module path
  (``nn_module_stack``, the type kept as its name) and the spec of Dynamo's example value: shape,
  dtype and layout (strides, storage offset, the earlier value it shares a storage with or is),
  from :class:`~embedl_dynamo.dynamo.example_values.ValueLayouts`. The example values themselves
  (fake tensors) are made again at load from those specs
  (:func:`~embedl_dynamo.dynamo.example_values.add_example_values`), so views share storage and
  in-place ops return their input as Dynamo recorded them. Only static shapes are saved: a
  symbolic size refuses the graph.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.dynamo.example_values import DTYPES, SPEC_KEY, ValueLayouts
from embedl_dynamo.errors import SavedFunctionError

__all__ = ["MODULES", "graph_from_data", "graph_to_data"]

#: the modules a saved graph's functions are looked up in, by the name a record gives
MODULES: dict[str, Any] = {
    "torch": torch,
    "torch.nn.functional": F,
    "torch._C._nn": torch._C._nn,
    "torch._C._linalg": torch._C._linalg,
    "torch._C._fft": torch._C._fft,
    "torch._C._special": torch._C._special,
    "torch._C": torch._C,
    "torch.linalg": torch.linalg,
    "torch.fft": torch.fft,
    "torch.special": torch.special,
    "torch.functional": torch.functional,
    "torch.Tensor": torch.Tensor,
    "operator": operator,
    "math": math,
}
_BUILTINS = {f.__name__: f for f in (getattr, len, abs, min, max, round, int, float, bool)}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPS = ("placeholder", "call_function", "call_method", "output")
_FORMATS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.memory_format)}
_LAYOUTS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
_STATIC = "_dynamo_static_input_type"
_NAMED_KINDS = (
    ("dtype", torch.dtype),
    ("memory_format", torch.memory_format),
    ("layout", torch.layout),
    ("device", torch.device),
)


def graph_to_data(gm: fx.GraphModule) -> list[dict[str, Any]]:
    """The nodes of Dynamo's graph ``gm`` as JSON-safe records (see the module).

    Raises:
        SavedFunctionError: a node holds a submodule, a constant attribute, a target outside
            :data:`MODULES`, an argument JSON cannot hold, or a symbolic size.
    """
    layouts = ValueLayouts()
    return [_node_to_data(node, layouts) for node in gm.graph.nodes]


def _node_to_data(node: fx.Node, layouts: ValueLayouts) -> dict[str, Any]:
    if node.op not in _OPS:
        raise SavedFunctionError(
            f"node {node.name} is a {node.op} (a submodule or a constant attribute); a saved "
            "compiled function holds plain graphs only: keep the model's forward free of "
            "higher-order ops (torch.cond, checkpointing) or use embedl_dynamo.export"
        )
    data: dict[str, Any] = {
        "op": node.op,
        "name": node.name,
        "target": _target_to_data(node),
        "args": _encode(node.args, node),
        "kwargs": _encode(dict(node.kwargs), node),
    }
    stack = node.meta.get("nn_module_stack")
    if stack:
        data["modules"] = [[str(k), str(v[0]), _type_name(v[1])] for k, v in stack.items()]
    static = (node.meta.get("tensor_dict") or {}).get(_STATIC)
    if isinstance(static, str):
        data["static"] = static
    if node.op != "output":
        data["value"] = layouts.spec(node)
    return data


def _type_name(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def _target_to_data(node: fx.Node) -> Any:
    target = node.target
    if node.op in ("placeholder", "output", "call_method"):
        if not isinstance(target, str) or not _IDENTIFIER.match(target):
            raise SavedFunctionError(f"node {node.name}: target {target!r} is not a plain name")
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return {"aten": str(target)}
    name = getattr(target, "__name__", None)
    if isinstance(name, str):
        for module_name, module in MODULES.items():
            if getattr(module, name, None) is target:
                return {"fn": [module_name, name]}
        if _BUILTINS.get(name) is target:
            return {"fn": ["builtins", name]}
    raise SavedFunctionError(
        f"node {node.name} calls {target!r}, which a saved compiled function cannot name (it "
        f"looks functions up in {', '.join(MODULES)}); compile this model with torch.compile "
        "and a warm cache, or use embedl_dynamo.export"
    )


def _target_from_data(data: Any, op: str) -> Any:
    if op != "call_function":
        if not isinstance(data, str) or not _IDENTIFIER.match(data):
            raise SavedFunctionError(f"saved graph: invalid {op} target {data!r}")
        return data
    if isinstance(data, dict) and isinstance(data.get("aten"), str):
        return _aten_op(data["aten"])
    where = data.get("fn") if isinstance(data, dict) else None
    if isinstance(where, list) and len(where) == 2 and all(isinstance(w, str) for w in where):
        module_name, name = where
        if module_name == "builtins" and name in _BUILTINS:
            return _BUILTINS[name]
        module = MODULES.get(module_name)
        found = (
            getattr(module, name, None) if module is not None and _IDENTIFIER.match(name) else None
        )
        if callable(found):
            return found
    raise SavedFunctionError(f"saved graph: target {data!r} is not one this package looks up")


def _aten_op(name: str) -> Any:
    parts = name.split(".")
    if not 2 <= len(parts) <= 3 or not all(_IDENTIFIER.match(p) for p in parts):
        raise SavedFunctionError(f"saved graph: invalid operator name {name!r}")
    try:
        found: Any = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(found, parts[2]) if len(parts) == 3 else found
    except AttributeError as exc:
        raise SavedFunctionError(f"saved graph: operator {name} does not exist here") from exc


def _encode(value: Any, node: fx.Node) -> Any:
    """``value`` as JSON (see the module); raises for what JSON cannot hold."""
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Size):
        return {"size": [_encode(v, node) for v in value]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, node) for v in value]}
    if isinstance(value, list):
        return [_encode(v, node) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _encode(v, node)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [_encode(v, node) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, complex):
        return {"complex": [_encode(value.real, node), _encode(value.imag, node)]}
    for tag, kind in _NAMED_KINDS:
        if isinstance(value, kind):
            return {tag: str(value)}
    raise SavedFunctionError(
        f"node {node.name}: argument {value!r} ({type(value).__name__}) cannot be saved as data"
    )


def _decode(value: Any, nodes: dict[str, fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode(v, nodes) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise SavedFunctionError(f"saved graph: malformed argument {value!r}")
    tag, inner = next(iter(value.items()))
    if tag == "node":
        if inner not in nodes:
            raise SavedFunctionError(f"saved graph: argument names unknown node {inner!r}")
        return nodes[inner]
    decoders: dict[str, Callable[[Any], Any]] = {
        "float": lambda v: float(v) if v in ("inf", "-inf", "nan") else _bad(value),
        "size": lambda v: torch.Size(_decode(v, nodes)),
        "tuple": lambda v: tuple(_decode(v, nodes)),
        "dict": lambda v: {str(k): _decode(x, nodes) for k, x in v},
        "slice": lambda v: slice(*_decode(v, nodes)),
        "ellipsis": lambda v: Ellipsis,
        "complex": lambda v: complex(*v),
        "dtype": lambda v: _named(DTYPES, v, value),
        "memory_format": lambda v: _named(_FORMATS, v, value),
        "layout": lambda v: _named(_LAYOUTS, v, value),
        "device": lambda v: torch.device(str(v)),
    }
    if tag not in decoders:
        raise SavedFunctionError(f"saved graph: unknown argument tag {tag!r}")
    return decoders[tag](inner)


def _named(table: dict[str, Any], name: Any, value: Any) -> Any:
    return table[name] if name in table else _bad(value)


def _bad(value: Any) -> Any:
    raise SavedFunctionError(f"saved graph: malformed argument {value!r}")


def graph_from_data(records: Sequence[dict[str, Any]]) -> fx.GraphModule:
    """The GraphModule :func:`graph_to_data` described: same nodes, names and metadata, no
    example values yet
    (:func:`~embedl_dynamo.dynamo.example_values.add_example_values`).

    Raises:
        SavedFunctionError: a record is malformed or names a target outside :data:`MODULES`.
    """
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    for data in records:
        op = data.get("op")
        if op not in _OPS:
            raise SavedFunctionError(f"saved graph: unknown node op {op!r}")
        target = _target_from_data(data.get("target"), op)
        args = _decode(data.get("args", {"tuple": []}), nodes)
        kwargs = _decode(data.get("kwargs", {"dict": []}), nodes)
        name = data.get("name")
        node = graph.create_node(op, target, tuple(args), dict(kwargs), name=name)
        if node.name != name:
            raise SavedFunctionError(f"saved graph: node name {name!r} cannot be restored")
        if data.get("modules"):
            node.meta["nn_module_stack"] = {k: (path, kind) for k, path, kind in data["modules"]}
        if isinstance(data.get("static"), str):
            node.meta["tensor_dict"] = {_STATIC: data["static"]}
        if op != "output":
            node.meta[SPEC_KEY] = data.get("value")
        nodes[str(name)] = node
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)
