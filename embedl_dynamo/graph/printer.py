"""A normalised, readable printout of a graph, stable across torch releases, for snapshots.

``print_graph(gm)`` writes one line per operation::

    conv_bn_relu_conv1 = FusedConv[relu](x)
    add = add(conv_bn_conv2, conv_bn_relu_conv1)

Targets are short names (``add``, ``conv2d``), constants are ``$path`` and literal keyword
arguments are dropped unless ``literals=True``; placeholders keep their order.
"""

from __future__ import annotations

from typing import Any

from torch import fx

__all__ = ["format_graph"]


def _target_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        tag = getattr(module, "activation", None)
        return f"{type(module).__name__}[{tag}]" if tag else type(module).__name__
    if node.op == "call_method":
        return f".{node.target}"
    name = getattr(node.target, "__name__", str(node.target))
    return name.lstrip("_")


def _value(value: Any, names: dict[fx.Node, str]) -> str:
    if isinstance(value, fx.Node):
        return names[value]
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_value(v, names) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


def format_graph(gm: fx.GraphModule, literals: bool = False) -> str:
    """The graph as ``name = op(inputs)`` lines; constants print as ``$attr.path``."""
    names: dict[fx.Node, str] = {}
    lines = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            names[node] = node.name
            lines.append(f"input {node.name}")
            continue
        if node.op == "get_attr":
            names[node] = f"${node.target}"
            continue
        if node.op == "output":
            lines.append(f"return {_value(node.args[0], names)}")
            continue
        names[node] = node.name
        parts = [_value(a, names) for a in node.args]
        for key, value in node.kwargs.items():
            if isinstance(value, fx.Node) or (
                isinstance(value, (list, tuple)) and any(isinstance(v, fx.Node) for v in value)
            ):
                parts.append(f"{key}={_value(value, names)}")
            elif literals:
                parts.append(f"{key}={_value(value, names)}")
        lines.append(f"{node.name} = {_target_name(gm, node)}({', '.join(parts)})")
    return "\n".join(lines)
