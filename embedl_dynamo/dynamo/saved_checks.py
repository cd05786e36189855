"""What a saved compiled function checks that PyTorch's saved guards do not: the weights it is
given, and the grad and autocast state of a call.

PyTorch 2.13's ``aot_compile`` drops the guards on the module's identity when it saves, so a
loaded function takes a module with other weights of the same shapes; the artifacts it loads
hold the saved weights. So the weights Dynamo passes are checked against the digests saved
with the function (:func:`weights_record`, :func:`weights_problem`): all at once through
:func:`~embedl_dynamo.cache.keys.fingerprint_graph` (whose digests the compile that follows
reuses rather than hashing the weights again), each one only to name the first that differs.
Once loaded, a weight changed in place is seen per call as in any compiled graph
(:class:`~embedl_dynamo.dynamo.frozen_weights.FrozenWeights`).

PyTorch's own guards refuse a call under another grad mode or autocast state with a
``GuardManager check failed`` message, and (measured on torch 2.13) any call under
``torch.inference_mode()`` or with an inference tensor, whose dispatch keys differ from those
it saved. :func:`call_problem` names each of these in one line, for
:func:`embedl_dynamo.load_compiled`'s function to raise before PyTorch's guards do.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from embedl_dynamo.cache.digests import blake3_digest
from embedl_dynamo.cache.keys import fingerprint_graph, tensor_bytes
from embedl_dynamo.cache.numerics import numerics_state
from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of
from embedl_dynamo.graph.freeze import is_lifted_constant

__all__ = [
    "call_problem",
    "call_state",
    "model_weights",
    "weight_positions",
    "weights_problem",
    "weights_record",
]


def call_state() -> dict[str, Any]:
    """The state a call computes under: grad mode, the default dtype and autocast's dtypes."""
    return {"grad": torch.is_grad_enabled(), "numerics": numerics_state()}


def call_problem(saved: dict[str, Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why a call under this thread's state, with these arguments, cannot run the function
    saved under ``saved`` (:func:`call_state`), naming the fix; None when it can."""
    grad, numerics = torch.is_grad_enabled(), numerics_state()
    if torch.is_inference_mode_enabled():
        return (
            "it is called under torch.inference_mode(), whose tensors PyTorch's saved guards "
            "refuse (torch 2.13): call it under torch.no_grad() instead"
        )
    if grad != saved.get("grad"):
        now, then = ("on", "off") if grad else ("off", "on")
        fix = "call it under torch.no_grad()" if grad else "call it with grad enabled"
        return f"grad mode is {now} and it was saved with grad {then}: {fix}"
    if numerics != saved.get("numerics"):
        return (
            f"it is called under {_describe(numerics)} and was saved under "
            f"{_describe(saved.get('numerics') or {})}: call it as it was saved, or save it "
            "again under this state"
        )
    for position, value in enumerate(pytree.tree_leaves((list(args), kwargs))):
        if isinstance(value, torch.Tensor) and value.is_inference():
            return (
                f"argument {position} is an inference tensor (made under "
                "torch.inference_mode()), which PyTorch's saved guards refuse: make the inputs "
                "outside inference_mode, and call it under torch.no_grad()"
            )
    return None


def _describe(numerics: dict[str, Any]) -> str:
    autocast = numerics.get("autocast") or {}
    parts = [f"autocast({device}, {dtype})" for device, dtype in sorted(autocast.items())]
    parts.append(f"default dtype {numerics.get('default_dtype')}")
    return (" and ".join(parts)) if autocast else f"no autocast, {parts[-1]}"


def weight_positions(
    gm: fx.GraphModule, example_inputs: Sequence[Any], analysis: GraphAnalysis | None = None
) -> list[int]:
    """The positions of Dynamo's arguments that are the model's parameters and buffers, less
    those the graph writes in place (a static KV cache: state, not weights); ``analysis`` is
    ``gm``'s (:mod:`embedl_dynamo.graph.analysis`), where the caller has it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set(analysis_of(gm, analysis).written_inputs.values())
    return [
        i
        for i, (node, value) in enumerate(zip(placeholders, example_inputs))
        if is_lifted_constant(node, value) and node not in written
    ]


def _fingerprint(tensors: Sequence[torch.Tensor]) -> str:
    """One digest of ``tensors``' bytes, dtypes and shapes, in order; the digest of each is
    kept for the compile that keys the same weights next."""
    graph = fx.Graph()
    graph.output(None)
    holder = fx.GraphModule(nn.Module(), graph)
    for position, tensor in enumerate(tensors):
        holder.register_buffer(f"w{position}", tensor.detach())
    return fingerprint_graph(holder)


def _each(tensor: torch.Tensor) -> str:
    return blake3_digest(tensor_bytes(tensor)).hex()


def weights_record(
    gm: fx.GraphModule, example_inputs: Sequence[Any], analysis: GraphAnalysis | None = None
) -> tuple[dict[str, Any], list[weakref.ref]]:
    """What :func:`weights_problem` compares a later call's weights with, and weak references
    to the weights (to name them by the model's state_dict when it is saved); ``analysis`` is
    ``gm``'s, where the caller has it."""
    positions = weight_positions(gm, example_inputs, analysis)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [example_inputs[i] for i in positions]
    record = {
        "positions": positions,
        "names": [names[i] for i in positions],
        "digest": _fingerprint(tensors),
        "each": [_each(t) for t in tensors],
        "state_names": None,
    }
    return record, [weakref.ref(t) for t in tensors]


def weights_problem(record: dict[str, Any], tensors: Sequence[torch.Tensor]) -> str | None:
    """Why ``tensors`` are not the weights ``record`` was saved with (the first that differs,
    by the model's name when known), or None."""
    if len(tensors) == len(record["each"]) and _fingerprint(tensors) == record["digest"]:
        return None
    if len(tensors) != len(record["each"]):
        return f"it takes {len(record['each'])} weights, and {len(tensors)} were given"
    names = record.get("state_names") or record["names"]
    for name, tensor, digest in zip(names, tensors, record["each"]):
        if _each(tensor) != digest:
            return f"weight {name} {tuple(tensor.shape)} holds other values than it was saved with"
    return "the weights differ in dtype, shape or order from those it was saved with"


def model_weights(model: nn.Module, names: Sequence[str]) -> list[torch.Tensor] | str:
    """``model``'s parameters and buffers by their state_dict ``names``, or why not."""
    found = dict(model.named_parameters(remove_duplicate=False))
    found.update(model.named_buffers(remove_duplicate=False))
    missing = [n for n in names if n not in found]
    if missing:
        return f"the model has no weight named {missing[0]}"
    return [found[n] for n in names]
