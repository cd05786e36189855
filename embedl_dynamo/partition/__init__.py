"""Partitioning by capability: which nodes of a frozen graph run on which runtime.

The stage between freezing (:mod:`embedl_dynamo.graph`) and the rewrite pipeline: each node a
CPU runtime computes exactly (:mod:`embedl_dynamo.runtimes.conformance`) goes to it, grouped
into fragments by torch.fx's ``CapabilityBasedPartitioner``; the rest stays in PyTorch in the
same graph (:mod:`.support`, :mod:`.fragments`). :mod:`.stitch` puts the built fragments back
into the graph.
"""

from embedl_dynamo.partition.flops import call_flops, node_flops
from embedl_dynamo.partition.fragments import (
    Fragment,
    KeptNode,
    Partitioning,
    compute_nodes,
    fragment_of,
    is_compute_node,
    partition_graph,
)
from embedl_dynamo.partition.stitch import FragmentCall, can_stitch, fragment_inputs, stitch
from embedl_dynamo.partition.support import RuntimeSupport, is_free, picks_output

__all__ = [
    "can_stitch",
    "Fragment",
    "FragmentCall",
    "KeptNode",
    "Partitioning",
    "RuntimeSupport",
    "call_flops",
    "compute_nodes",
    "fragment_inputs",
    "fragment_of",
    "is_compute_node",
    "is_free",
    "node_flops",
    "partition_graph",
    "picks_output",
    "stitch",
]
