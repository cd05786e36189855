"""The rewrite engine: trace, canonicalise, convert to a fixpoint, plan fusions, apply.

* **Conversions** are structural rewrites (``Flatten -> Linear`` into ``Conv1x1 -> Flatten``,
  attention decomposition, no-op removal). They are applied while planning, round after round,
  until a round finds nothing new; a pattern set that keeps rewriting for
  :data:`MAX_CONVERSION_ROUNDS` rounds is an error naming the patterns still firing.
* **Fusions** are planned in one pass, longest pattern first; a match whose nodes an earlier
  (longer) match already claimed is kept in the plan with ``apply=False`` and the reason
  ``overlaps <pattern>@<path>``. Users may toggle entries before applying.

Nothing here touches the user's model: tracing reads it, and the plan works on a deep copy.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.graph.aliasing import keeps_side_effects, mutated_tensor, record_storages
from embedl_dynamo.graph.analysis import analyze
from embedl_dynamo.graph.canonicalize import canonicalize
from embedl_dynamo.graph.functionalize import functionalize, mutation_blocker
from embedl_dynamo.graph.nodes import module_path, node_value_meta
from embedl_dynamo.rewrite.match import Match
from embedl_dynamo.rewrite.matcher import find_matches, index_graph, match_at, verdict
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.plan import PatternMatch, TransformationPlan, TransformResult
from embedl_dynamo.rewrite.qdq import FusedModule

__all__ = [
    "MAX_CONVERSION_ROUNDS",
    "TransformResult",
    "apply_transformation_plan",
    "plan_transformation",
    "trace",
]

logger = logging.getLogger(__name__)

MAX_CONVERSION_ROUNDS = 8

# torch.nn modules whose forward cannot be symbolically traced (data-dependent control flow);
# they stay ``call_module`` leaves and the canonicaliser expands them.
_UNTRACEABLE_LEAVES: tuple[type[nn.Module], ...] = (
    nn.MultiheadAttention,
    nn.TransformerEncoder,
    nn.TransformerEncoderLayer,
)


class _Tracer(fx.Tracer):
    """``symbolic_trace``'s tracer, with attention modules kept as leaves, and buffers traced
    as graph values: by default a buffer is the real tensor while tracing, so ``self.b.add_(1)``
    would run on the user's buffer at trace time and vanish from the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.proxy_buffer_attributes = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, _UNTRACEABLE_LEAVES):
            return True
        return super().is_leaf_module(m, module_qualified_name)


class _Root(nn.Module):
    """Wraps a model that is itself a leaf (``nn.TransformerEncoder``) so it can be traced."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        return self.model(*args)

    def graph(self, count: int | None) -> fx.Graph:
        """``model(*inputs)`` as a graph (``symbolic_trace`` cannot trace ``*args``)."""
        import inspect

        params = list(inspect.signature(self.model.forward).parameters.values())
        if count is None:
            count = sum(1 for p in params if p.default is inspect.Parameter.empty)
        graph = fx.Graph()
        inputs = tuple(graph.placeholder(p.name) for p in params[:count])
        graph.output(graph.call_module("model", inputs))
        return graph


def trace(
    model: nn.Module, args: Sequence[Any] | None = None, shapes: bool = True
) -> fx.GraphModule:
    """Trace ``model`` to a GraphModule (``call_module`` nodes kept), with shapes if ``args``.

    Args:
        model: an ``nn.Module`` or ``fx.GraphModule``; it is not modified.
        args: example inputs; when given, every node gets its shape (needed by shape-dependent
            canonicalisations such as ``view(n, -1)`` -> ``flatten``).
        shapes: propagate shapes through ``args`` (False: only trace; the graph is not run).

    Returns:
        A new GraphModule that shares the model's tensors: rewrites put new tensors in place
        of old ones and never write into them, and
        [apply_transformation_plan][embedl_dynamo.apply_transformation_plan] copies the ones
        its result keeps (a copy here would cost every compile a pass over all the
        model's weights).

    Example:
        >>> import torch, embedl_dynamo
        >>> type(embedl_dynamo.trace(torch.nn.Linear(4, 2), (torch.randn(1, 4),))).__name__
        'GraphModule'
    """
    if isinstance(model, fx.GraphModule):
        gm = _copy_sharing_tensors(model)
    else:
        if isinstance(model, _UNTRACEABLE_LEAVES):
            root = _Root(model)
            graph = root.graph(len(args) if args is not None else None)
        else:
            root = model
            try:
                graph = _Tracer().trace(root)
            except Exception as exc:  # TraceError, float(Proxy), **kwargs forwards (HF), ...
                if args is None:
                    raise
                # data-dependent control flow or Python symbolic tracing cannot follow:
                # Dynamo specialises on ``args`` instead
                logger.debug("symbolic_trace failed (%s); capturing with Dynamo", exc)
                from embedl_dynamo.graph.capture import capture

                return trace(capture(model, args), args, shapes)
        gm = _copy_sharing_tensors(fx.GraphModule(root, graph, type(model).__name__))
    if args is not None and shapes:
        _propagate_shapes(gm, args)
    return gm


def _propagate_shapes(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    from torch.fx.passes.shape_prop import ShapeProp

    with torch.no_grad():
        ShapeProp(gm).propagate(*args)


def _entry(m: Match, apply: bool, reason: str, check_reason: str = "") -> PatternMatch:
    return PatternMatch(
        id=m.id,
        pattern=m.pattern,
        node=m.anchor.name,
        nodes=tuple(n.name for n in m.nodes),
        apply=apply,
        reason=reason,
        check_reason=check_reason,
    )


def _replace(m: Match) -> list[fx.Node]:
    """Apply one match: build the replacement, reroute users, drop the matched nodes.

    Returns the erased nodes.
    """
    anchor = m.anchor
    new = m.pattern.replace(m)
    if new is not anchor:
        if isinstance(new, fx.Node):
            if "embedl_path" not in new.meta:
                new.meta["embedl_path"] = module_path(anchor)
            # the replacement computes the anchor's value: later rules read its shape
            if node_value_meta(new) is None:
                for key in ("val", "example_value", "tensor_meta"):
                    if key in anchor.meta:
                        new.meta[key] = anchor.meta[key]
        anchor.replace_all_uses_with(new)
    erased = []
    for node in reversed(m.nodes):
        if node is not new and not node.users:
            m.gm.graph.erase_node(node)
            erased.append(node)
    return erased


def _dedupe_ids(matches: list[Match]) -> dict[int, str]:
    """Give repeated ids (a module called twice) a ``#2``, ``#3`` suffix, in graph order."""
    seen: dict[str, int] = {}
    ids = {}
    for m in matches:
        count = seen.get(m.id, 0) + 1
        seen[m.id] = count
        ids[id(m)] = m.id if count == 1 else f"{m.id}#{count}"
    return ids


def _run_conversions(
    gm: fx.GraphModule, conversions: list[Pattern], entries: list[PatternMatch]
) -> None:
    """Apply conversion patterns round after round until none fires."""
    declined: set[str] = set()
    for _round in range(MAX_CONVERSION_ROUNDS):
        fired: list[str] = []
        for pattern in conversions:
            op, target = pattern.compiled().anchor_key
            candidates = [n for n in gm.graph.nodes if n.op == op and n.target == target]
            erased: set[fx.Node] = set()
            for node in candidates:
                if node in erased:
                    continue
                # matched lazily: an earlier replacement may have changed this node's inputs
                m = match_at(pattern, gm, node)
                if m is None:
                    continue
                reason = verdict(m)
                if reason:
                    if m.id not in declined:
                        declined.add(m.id)
                        entries.append(_entry(m, False, reason, check_reason=reason))
                    continue
                entry = _entry(m, True, "")
                entry.applied = True
                erased.update(_replace(m))
                entries.append(entry)
                fired.append(pattern.name)
        if not fired:
            if _round:  # the graph changed: check it and regenerate its code
                gm.graph.lint()
                gm.recompile()
            return
    raise RuntimeError(
        f"conversions did not converge after {MAX_CONVERSION_ROUNDS} rounds; still firing: "
        f"{sorted(set(fired))}. A conversion's replacement must not match its own target."
    )


def _functional_or_warned(gm: fx.GraphModule, args: Sequence[Any] | None) -> bool:
    """Make ``gm``'s in-place ops functional (:mod:`embedl_dynamo.graph.functionalize`);
    False, with one warning, where that would change the results: the graph then gets no
    rewrite and runs its in-place ops as PyTorch does."""
    if not any(mutated_tensor(node) is not None for node in gm.graph.nodes):
        return True
    analysis = analyze(gm)
    reason = mutation_blocker(gm, analysis=analysis)
    if reason is not None and args is not None and not analysis.writes_into_input:
        record_storages(gm, args)  # exact aliasing instead of the ops' worst case
        analysis = analyze(gm)  # the storages recorded: another state to analyse
        reason = mutation_blocker(gm, analysis=analysis)
    if reason is not None:
        return _warn_unrewritten(reason)
    functionalize(gm, analysis=analysis)
    return True


def _warn_unrewritten(reason: str) -> bool:
    warnings.warn(
        f"embedl_dynamo: {reason}; the graph is left as traced, without rewrites, so PyTorch's "
        "in-place semantics hold",
        RuntimeWarning,
        stacklevel=4,
    )
    return False


def plan_transformation(
    graph_module: nn.Module,
    patterns: Sequence[Pattern],
    args: Sequence[Any] | None = None,
) -> TransformationPlan:
    """Canonicalise a deep copy, apply the conversions and plan the fusions.

    Args:
        graph_module: an ``fx.GraphModule`` (or ``nn.Module``, traced first); not modified.
        patterns: the conversion and fusion patterns to use.
        args: example inputs for shape-dependent rewrites (optional).

    Returns:
        The plan; ``plan.model`` is the converted copy that the fusion entries refer to.
    """
    gm = trace(graph_module, args, shapes=False)  # not run before its in-place ops are known
    if not _functional_or_warned(gm, args):
        return TransformationPlan(gm, [])
    if args is not None:
        _propagate_shapes(gm, args)
    canonicalize(gm)
    entries: list[PatternMatch] = []
    _run_conversions(gm, [p for p in patterns if p.phase == "conversion"], entries)

    fusions = sorted(
        (p for p in patterns if p.phase == "fusion"), key=lambda p: p.size, reverse=True
    )
    index = index_graph(gm)
    for pattern in fusions:
        matches = find_matches(pattern, gm, index)
        ids = _dedupe_ids(matches)
        for m in matches:
            reason = verdict(m)
            entry = _entry(m, not reason, reason, check_reason=reason)
            entry.id = ids[id(m)]
            entries.append(entry)
    plan = TransformationPlan(model=gm, entries=entries)
    plan.resolve_overlaps()  # longest pattern first: earlier entries claim their nodes
    logger.debug(
        "planned %d matches (%d conversions applied)", len(entries), sum(e.applied for e in entries)
    )
    return plan


def _tensor_slots(gm: nn.Module) -> Iterator[tuple[dict[str, Any], str, torch.Tensor]]:
    """``(owner dict, name, tensor)`` for every parameter, buffer and plain tensor attribute."""
    for module in gm.modules():
        for slots in (module._parameters, module._buffers, module.__dict__):
            for name, value in list(slots.items()):
                if isinstance(value, torch.Tensor):
                    yield slots, name, value


def _copy_sharing_tensors(gm: fx.GraphModule) -> fx.GraphModule:
    """Deep-copy ``gm`` but keep its tensors (parameters, buffers, tensor attributes) shared.

    Rewrites replace tensors (BatchNorm folded into new ones, fused modules' own copies), so
    copying them all first is wasted work; :func:`_unshare_tensors` copies the ones that survive.
    """
    memo: dict[int, Any] = {id(tensor): tensor for _, _, tensor in _tensor_slots(gm)}
    return copy.deepcopy(gm, memo)


def _unshare_tensors(gm: fx.GraphModule, source: fx.GraphModule) -> None:
    """Give ``gm`` its own copy of every tensor it still shares with ``source`` and may write.

    With parameters in ``source`` (a user's model: ``prepare_qat`` trains the result) every
    shared tensor is copied. A frozen graph (weights as plain constants, as a compile has them)
    keeps sharing what nothing writes: a tensor no ``call_module`` node owns (a later pass may
    rescale a module's weights in place, as SmoothQuant does) and no node writes through
    ``get_attr``; copying an LLM's weights would double the compile's memory for nothing.
    Tensors that share storage (a constant and a view of it, which a trace makes of a buffer
    created in ``forward``) keep sharing it: each storage is copied once and the views are
    rebuilt on the copy, so an in-place write through one still shows in the other."""
    shared = {id(tensor) for _, _, tensor in _tensor_slots(source)}
    frozen = not any(True for _ in source.parameters())
    written = _writable_tensors(gm) if frozen else shared
    copies: dict[int, Any] = {}
    for slots, name, tensor in _tensor_slots(gm):
        if id(tensor) in shared and id(tensor) in written:
            slots[name] = _copy_keeping_storage(tensor, copies)


def _writable_tensors(gm: fx.GraphModule) -> set[int]:
    """``id`` of every tensor of ``gm`` that a module call or an in-place node may write."""
    written: set[int] = set()
    fused: set[int] = set()  # a fused module reads a frozen constant in place (frozen_parameter)
    analysis = analyze(gm)  # the rewritten graph: analysed once here
    classes = analysis.classes
    mutated = {classes.get(t, t) for t in analysis.mutated.values()}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            owned = {id(t) for _, _, t in _tensor_slots(module)}
            written |= owned
            fused |= owned if isinstance(module, FusedModule) else set()
        elif node.op == "get_attr" and classes.get(node, node) in mutated:
            owner, _, name = str(node.target).rpartition(".")
            written.add(id(getattr(gm.get_submodule(owner) if owner else gm, name, None)))
    # a constant sharing storage with a written one (a view a trace made of it) is written too
    tensors = [t for _, _, t in _tensor_slots(gm)]
    storages = {_storage_key(t) for t in tensors if id(t) in written - fused}
    return written | {id(t) for t in tensors if _storage_key(t) in storages}


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _copy_keeping_storage(tensor: torch.Tensor, copies: dict[int, Any]) -> torch.Tensor:
    storage = tensor.untyped_storage()
    key = storage.data_ptr()
    if key not in copies or not storage.nbytes():
        copies[key] = storage.clone()
    copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    copy.set_(copies[key], tensor.storage_offset(), tensor.size(), tensor.stride())
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy


def apply_transformation_plan(plan: TransformationPlan) -> TransformResult:
    """Apply the plan's pending matches to a copy of ``plan.model``.

    Returns:
        A [TransformResult][embedl_dynamo.TransformResult]; the plan itself is left untouched,
        so it can be edited and applied again.

    Example:
        ```python
        plan = embedl_dynamo.get_transformation_plan(model.eval(), (x,))
        result = embedl_dynamo.apply_transformation_plan(plan)  # the plan is left as it was
        ```
    """
    gm = _copy_sharing_tensors(plan.model)
    nodes = {n.name: n for n in gm.graph.nodes}
    for entry in plan.entries:
        if entry.applied or not entry.apply:
            continue
        anchor = nodes.get(entry.node)
        m = match_at(entry.pattern, gm, anchor) if anchor is not None else None
        if m is None:
            raise RuntimeError(f"{entry.id} no longer matches node {entry.node}; re-plan the model")
        _replace(m)
    gm.graph.eliminate_dead_code(keeps_side_effects)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    _unshare_tensors(gm, plan.model)
    gm.recompile()
    report = plan.summary()
    return TransformResult(model=gm, plan=plan, report=report)
