"""``transpose`` with negative dims written with the non-negative dims they name.

PyTorch's TorchScript-based ONNX exporter resolves a negative ``transpose`` dim from the rank
it infers, and where it cannot infer one (after ``repeat_interleave``) it merges two
transposes into the wrong permutation: CANINE's ``k.transpose(-1, -2)`` after
``transpose(1, 2)`` was exported as ``[0, 3, 1, 2]`` where it is ``[0, 2, 3, 1]`` (ONNX Runtime
refuses the graph; with square sizes it would compute another product). The rank each input
had when traced is recorded, so :func:`nonnegative_transpose_dims` writes the dims the call
means, which the exporter reads as they are.
"""

from __future__ import annotations

import torch
from torch import fx

from embedl_dynamo.graph.nodes import node_value_meta

__all__ = ["nonnegative_transpose_dims"]


def _is_transpose(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in ("transpose", "swapaxes", "swapdims")
    return node.op == "call_function" and node.target in (
        torch.transpose,
        torch.swapaxes,
        torch.swapdims,
    )


def nonnegative_transpose_dims(gm: fx.GraphModule) -> int:
    """Write each ``transpose`` of ``gm`` whose dims are negative, on an input of recorded
    rank, with the non-negative dims (in place).

    Returns:
        How many calls were written so.

    Example:
        >>> import torch
        >>> def f(x):
        ...     return x.transpose(-1, -2)
        >>> gm = fx.symbolic_trace(f)
        >>> next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"] = torch.ones(2, 3, 4)
        >>> nonnegative_transpose_dims(gm), [n.args for n in gm.graph.nodes if n.op == "call_method"]
        (1, [(x, 2, 1)])
    """
    written = 0
    for node in gm.graph.nodes:
        if not _is_transpose(node) or len(node.args) != 3 or node.kwargs:
            continue
        source, first, second = node.args
        rank = (
            getattr(node_value_meta(source), "ndim", None) if isinstance(source, fx.Node) else None
        )
        dims = (first, second)
        if not isinstance(rank, int) or not all(type(d) is int for d in dims) or min(dims) >= 0:
            continue
        node.args = (source, *(d % rank if rank else d for d in dims))
        written += 1
    if written:
        gm.recompile()
    return written
