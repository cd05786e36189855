"""Which nodes of a frozen, functional graph a runtime may compute: the partitioner's capability.

A node goes to a CPU runtime where the conformance table says the runtime computes it as
PyTorch does (:func:`~embedl_dynamo.runtimes.conformance.node_blocker`), for that node's op and
input dtype, as Torch-TensorRT's ``OperatorSupport`` says which nodes its engine takes. Nodes
that hold no tensor (a size, ``x.shape``, integer arithmetic on sizes) are *free*: they are
never a fragment's output, and a fragment that reads one recomputes it from the tensor it is
read from (:mod:`.fragments`). Picking one output of a multi-output op goes where the op goes.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping

import torch
from torch import fx, nn
from torch.fx.passes.operator_support import OperatorSupportBase

from embedl_dynamo.graph.nodes import node_value_meta
from embedl_dynamo.runtimes.conformance import node_blocker

__all__ = ["CALLS", "RuntimeSupport", "is_free", "picks_output"]

#: the node kinds that compute something
CALLS = ("call_function", "call_method", "call_module")


def picks_output(node: fx.Node) -> bool:
    """Whether ``node`` picks one output of a multi-output op (``operator.getitem`` on a
    tuple): it computes nothing and belongs with the op."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    source = node.args[0]
    return isinstance(source, fx.Node) and isinstance(node_value_meta(source), (tuple, list))


def _holds_tensors(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)


def is_free(node: fx.Node) -> bool:
    """Whether ``node`` is a call that holds no tensor (a size, an attribute of a tensor, a
    number computed from sizes): recomputed wherever it is read, never passed between parts."""
    if node.op not in CALLS:
        return False
    value = node_value_meta(node)
    return value is not None and not _holds_tensors(value)


class RuntimeSupport(OperatorSupportBase):
    """The nodes ``runtime`` may compute, for torch.fx's ``CapabilityBasedPartitioner``.

    Args:
        runtime: the runtime's name (``onnxruntime``, ``openvino``...).
        taken: nodes an earlier runtime already took (not offered again).
        forced_out: op names the user keeps in PyTorch (``torch_executed_ops``).
        held: nodes kept in PyTorch whatever their op, with the reason (the partitioner's
            own: an in-place write and its readers split between parts).

    ``reasons`` records, per node refused, why (the report's words).
    """

    def __init__(
        self,
        runtime: str,
        taken: Iterable[fx.Node] = (),
        forced_out: Iterable[str] = (),
        held: Mapping[fx.Node, str] | None = None,
    ) -> None:
        self.runtime = runtime
        self.taken = set(taken)
        self.forced_out = frozenset(forced_out)
        self.held = dict(held or {})
        self.reasons: dict[fx.Node, str] = {}

    def is_node_supported(self, submodules: Mapping[str, nn.Module], node: fx.Node) -> bool:
        if node.op not in CALLS or node in self.taken or is_free(node):
            return False
        if picks_output(node):
            return self.is_node_supported(submodules, node.args[0])
        reason = self.blocker(node)
        if reason is not None:
            self.reasons[node] = reason
            return False
        return True

    def blocker(self, node: fx.Node) -> str | None:
        """Why ``node`` may not run on this runtime (None: it may)."""
        name = str(getattr(node.target, "__name__", node.target))
        if name in self.forced_out:
            return f"{name} is in torch_executed_ops; runs in PyTorch"
        return node_blocker(node, self.runtime) or self.held.get(node)
