"""Which constants of the exported module each initializer the ONNX exporter computed is
computed from, recorded while the TorchScript exporter folds them, for a refit.

The exporter folds an ONNX node whose inputs are all constants into an initializer of its
own: a rotary embedding's ``inv_freq`` times the positions becomes ``onnx::Cos_347``, the
argument of the runtime's ``Cos``. Such an initializer is named after no constant of the
transformed graph, so a refit (:mod:`.refit_weights`) cannot compute it anew; it is what a new
export writes, bit for bit, exactly when every constant it is computed from is unchanged.

:func:`record_initializer_sources` hooks the exporter's folding passes and proves that from
the graph itself. Before ``ConstantFoldONNX`` runs, every value computed from constants alone
is given the set of the module's constants (parameters and buffers) it is computed from, for
each place it is read (the reading node and the input's position). The pass folds a node by
replacing its single output with a new initializer wherever it is read, and changes no other
input: the new initializer read at a place is the value that was read there, and is computed
from that value's constants. An initializer read at a place the walk did not see, or made by
the evaluation peephole (which rewires a convolution's inputs), has unknown sources. The
de-duplication pass that follows keeps an initializer equal to another as an ``Identity`` of
it under its own name, which keeps its own sources; were one merged otherwise, no computed
initializer's sources would be known.

Each source is recorded with its digest when the export saw it (up to
:data:`~.constant_views.FOLDED_MAX_BYTES`; a larger one without, so it counts as changed), in
the file's metadata (:data:`SOURCES_KEY`), where a refit in any later process reads it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from embedl_dynamo.graph.weight_recipe import tensor_digest
from embedl_dynamo.onnx.constant_views import EXPORTED_PREFIX, FOLDED_MAX_BYTES
from embedl_dynamo.onnx.exporter_hooks import replaced_passes

__all__ = [
    "SOURCES_KEY",
    "InitializerSources",
    "initializer_sources",
    "mark_initializer_sources",
    "record_initializer_sources",
]

#: the ONNX metadata entry: JSON ``{initializer: {constant: digest or null} or null}`` of the
#: initializers the exporter computed (null: sources unknown)
SOURCES_KEY = "embedl.initializer_sources"

_FOLD, _PEEPHOLE = "_jit_pass_onnx_constant_fold", "_jit_pass_onnx_eval_peephole"
_DEDUP = "_jit_pass_onnx_deduplicate_initializers"
_CONSTANT_KINDS = frozenset({"onnx::Constant", "prim::Constant"})
_RETURN = -1  # the place key of the graph's outputs

Sources = frozenset[int] | None  # the unique ids of the module's constants; None: unknown
Place = tuple[int, int]  # (the first output's unique id of the reading node, or _RETURN; input)


class InitializerSources:
    """What :func:`record_initializer_sources` found: for each initializer the exporter
    computed (by its final name), the module's constants it is computed from, with digests."""

    def __init__(self) -> None:
        self._sources: dict[int, Sources] = {}  # a computed initializer's unique id -> sources
        self._names: dict[int, str] = {}  # a module constant's unique id -> its name
        self._tensors: dict[int, Any] = {}  # its value, hashed where a refit reads it
        self.computed: dict[str, dict[str, str | None] | None] = {}

    def _of(self, unique: int) -> Sources:
        """The sources of a param: a computed one's, or the constant itself."""
        return self._sources[unique] if unique in self._sources else frozenset({unique})

    def _learn(self, graph: Any, params: Mapping[str, Any]) -> dict[int, str]:
        """The params of ``graph`` by unique id; the module's constants among them named and
        hashed (the first pass sees them all)."""
        found = {}
        for value in graph.inputs():
            name = value.debugName()
            if name in params:
                unique = value.unique()
                found[unique] = name
                if unique not in self._sources and unique not in self._names:
                    self._names[unique], self._tensors[unique] = name, params[name]
        return found

    def fold(self, original: Callable[..., Any], peephole: bool) -> Callable[..., Any]:
        """A folding pass that records the sources of the initializers it makes."""

        def run(graph: Any, params: dict[str, Any], *rest: Any) -> Any:
            found = self._learn(graph, params)
            before = set(params)
            places = {} if peephole else _constant_places(graph, found, self._of)
            result = original(graph, params, *rest)
            made = set(result) - before
            readers: dict[int, list[Place]] = {}
            for place, value in _reads(graph):
                if _is_param(value, made):
                    readers.setdefault(value.unique(), []).append(place)
            for unique, where in readers.items():
                seen = [places.get(p, False) for p in where]
                known = [s for s in seen if s is not False and s is not None]
                self._sources[unique] = _union(known) if len(known) == len(seen) else None
            return result

        return run

    def dedup(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The de-duplication pass, recording the computed initializers by their final names.

        It keeps an initializer it merges into an equal one as an ``Identity`` of it, under its
        own name (a refit reads each name's sources); one it merges otherwise leaves its
        readers reading another initializer, so no computed one's sources are known."""

        def run(graph: Any, params: dict[str, Any], *rest: Any) -> Any:
            found = self._learn(graph, params)
            values = {name: params[name] for name in found.values()}
            result = original(graph, params, *rest)
            kept = {v.debugName() for v in graph.inputs()} | {
                out.debugName()
                for node, _ in _nodes(graph)
                if node.kind() == "onnx::Identity"
                for out in node.outputs()
            }
            redirected = any(name not in kept for name in found.values())
            self.computed = {
                name: None if redirected else self._named(self._sources[u], values[name])
                for u, name in found.items()
                if u in self._sources and name in kept
            }
            return result

        return run

    def _named(self, sources: Sources, value: Any) -> dict[str, str | None] | None:
        """The sources by the constants' names, hashed where a refit reads the digests: for
        an initializer of more than one float (a refit takes another as independent of the
        weights) that is no view of one of them (a transposed weight, written anew)."""
        if sources is None:
            return None
        hashed = _floats(value) and not any(_shares(value, self._tensors[u]) for u in sources)
        return {
            self._names[u].removeprefix(EXPORTED_PREFIX): (
                _digest(self._tensors[u]) if hashed else None
            )
            for u in sorted(sources)
        }


def _floats(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1


def _shares(a: Any, b: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
    )


def _digest(value: Any) -> str | None:
    if not isinstance(value, torch.Tensor) or value.numel() * value.element_size() > (
        FOLDED_MAX_BYTES
    ):
        return None
    return tensor_digest(value)


def _union(sets: list[Sources]) -> Sources:
    if any(s is None for s in sets):
        return None
    return frozenset().union(*sets)  # type: ignore[arg-type]


def _is_param(value: Any, params: Mapping[str, Any]) -> bool:
    return value.node().kind() == "prim::Param" and value.debugName() in params


def _nodes(block: Any) -> Iterator[tuple[Any, bool]]:
    """Every node of ``block`` and its nested blocks, in order, with whether it is nested."""
    for node in block.nodes():
        yield node, False
        for inner in node.blocks():
            yield from ((n, True) for n, _ in _nodes(inner))


def _place_key(node: Any) -> int | None:
    outputs = list(node.outputs())
    return outputs[0].unique() if outputs else None


def _reads(graph: Any) -> Iterator[tuple[Place, Any]]:
    """Each place a value is read at (a node with outputs, or the graph's outputs)."""
    for node, _ in _nodes(graph):
        key = _place_key(node)
        if key is not None:
            for i, value in enumerate(node.inputs()):
                yield (key, i), value
    for i, value in enumerate(graph.return_node().inputs()):
        yield (_RETURN, i), value


def _constant_places(
    graph: Any, params: Mapping[int, str], sources_of: Callable[[int], Sources]
) -> dict[Place, Sources]:
    """The sources of every value computed from constants alone, at each place it is read."""
    value_sources: dict[int, Sources] = {u: sources_of(u) for u in params}
    for node, nested in _nodes(graph):
        inputs = [value_sources.get(v.unique(), False) for v in node.inputs()]
        constant = all(s is not False for s in inputs) and (
            bool(inputs) or node.kind() in _CONSTANT_KINDS
        )
        if constant and not nested and not list(node.blocks()):
            value = _union([s for s in inputs if s is not False])  # type: ignore[misc]
            for output in node.outputs():
                value_sources[output.unique()] = value
    return {
        place: value_sources[v.unique()]
        for place, v in _reads(graph)
        if v.unique() in value_sources
    }


@contextlib.contextmanager
def record_initializer_sources() -> Iterator[InitializerSources]:
    """Within the block, record the sources of every initializer the TorchScript exporter
    computes (see the module); filled once ``torch.onnx.export`` returns.

    Example:
        >>> with record_initializer_sources() as sources:
        ...     pass  # torch.onnx.export(..., dynamo=False)
        >>> sources.computed
        {}
    """
    sources = InitializerSources()
    wrappers = {
        _PEEPHOLE: lambda original: sources.fold(original, peephole=True),
        _FOLD: lambda original: sources.fold(original, peephole=False),
        _DEDUP: sources.dedup,
    }
    with replaced_passes(wrappers):
        yield sources


def mark_initializer_sources(model: Any, sources: InitializerSources) -> None:
    """Write what ``sources`` recorded into ``model``'s metadata (``onnx.ModelProto``)."""
    if sources.computed:
        entry = model.metadata_props.add()
        entry.key, entry.value = SOURCES_KEY, json.dumps(sources.computed, sort_keys=True)


def initializer_sources(model: Any) -> dict[str, dict[str, str | None] | None]:
    """Initializer -> the constants (and their digests) the exporter computed it from, for the
    initializers it computed (None: unknown), as the export recorded.

    Example:
        >>> import onnx
        >>> initializer_sources(onnx.ModelProto())
        {}
    """
    for entry in model.metadata_props:
        if entry.key == SOURCES_KEY:
            return dict(json.loads(entry.value))
    return {}
