"""A served model's outputs: the structure ``load()`` returns, as named KServe v2 tensors.

``load()`` gives back what the model returned: a tensor, a tuple, or a dict, nested tuples and
lists and ``None`` (:class:`~embedl_dynamo.graph.output_tree.OutputTree`), which is what most
transformers models return. KServe v2 answers with a flat list of named tensors, so
:class:`ServedOutputs` names each tensor leaf by where it sits in the structure, with stable
names a client can rely on across requests and replicas:

* a model that returns one tensor, or a flat tuple of the file's outputs in order (or a file
  without a recorded structure), keeps the ONNX file's output names (``output_0``, ...);
* any other structure names a leaf by its path, keys and positions joined by dots: ``logits``,
  ``past_key_values.0.1`` for ``{"logits": t, "past_key_values": ((k, v), ...)}``; should two
  paths spell one name (a key holding a dot), every leaf is named ``leaf_<i>`` instead, ``i``
  its position among the leaves;
* leaves that are no tensor (``None``, a number, a string the model returned as it is) are
  left out of the answer and recorded in :attr:`ServedOutputs.omitted` (the model's metadata
  lists them), since KServe v2 has no tensor for them;
* a leaf that is one of the model's inputs returned unchanged is answered from the request.

A Python caller (the deployment handle) gets the structure itself, numpy arrays in place of
tensors (:meth:`ServedOutputs.structure`), as ``load()``'s module gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch.utils._pytree as pytree

from embedl_dynamo.graph.output_tree import OutputTree
from embedl_dynamo.serve.kserve import TensorSpec

__all__ = ["ServedOutputs"]


def _key(entry: Any) -> str:
    """One step of a pytree key path as a name part: a dict key, a position, an attribute."""
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _key_paths(tree: OutputTree) -> list[tuple[Any, ...]]:
    """The pytree key path of each leaf of ``tree``, in leaf order."""
    spec = pytree.treespec_loads(tree.spec)
    placed = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    paths: list[tuple[Any, ...]] = [()] * spec.num_leaves
    for path, index in pytree.tree_flatten_with_path(placed)[0]:
        paths[index] = tuple(path)
    return paths


def _plain(tree: OutputTree, paths: list[tuple[Any, ...]]) -> bool:
    """Whether the structure is the file's own outputs in order: one tensor, or a flat tuple
    or list of them."""
    in_order = list(tree.leaves) == [("output", i) for i in range(tree.count)]
    flat = all(len(path) <= 1 and all(hasattr(e, "idx") for e in path) for path in paths)
    return in_order and flat


class ServedOutputs:
    """The named tensors a served model answers with, and how to fill them per request.

    Args:
        tree: the model's output structure (``load()``'s ``output_tree``; None: flat).
        graph_outputs: the ONNX file's outputs as specs, in its order.
        inputs: the ONNX file's inputs as specs, in its order.

    Attributes:
        specs: one spec per tensor leaf, in leaf order.
        omitted: ``(name, value)`` of each leaf that is no tensor (``None``, a number).
    """

    def __init__(
        self,
        tree: OutputTree | None,
        graph_outputs: Sequence[TensorSpec],
        inputs: Sequence[TensorSpec],
    ) -> None:
        self.tree = tree
        self.specs: list[TensorSpec] = []
        self.omitted: list[tuple[str, Any]] = []
        self._picks: list[tuple[str, int]] = []  # per spec: ("output" | "input", index)
        key_paths = _key_paths(tree) if tree is not None else []
        if tree is None or _plain(tree, key_paths):
            self.specs = list(graph_outputs)
            self._picks = [("output", i) for i in range(len(graph_outputs))]
            return
        paths = [".".join(_key(entry) for entry in path) for path in key_paths]
        if len(set(paths)) != len(paths) or "" in paths:
            paths = [f"leaf_{i}" for i in range(len(paths))]
        for path, (kind, ref) in zip(paths, tree.leaves):
            if kind == "value":
                self.omitted.append((path, ref))
                continue
            source = graph_outputs[ref] if kind == "output" else inputs[ref]
            self.specs.append(TensorSpec(path, source.datatype, source.shape))
            self._picks.append((kind, ref))

    def arrays(
        self, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The answer's arrays, one per :attr:`specs`, from the file's ``outputs`` for a
        request and the request's ``inputs``."""
        return [outputs[ref] if kind == "output" else inputs[ref] for kind, ref in self._picks]

    def structure(self, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> Any:
        """What ``load()``'s module returns for the request, numpy arrays in place of tensors:
        the recorded structure, else one array for one output and a tuple for several."""
        if self.tree is not None:
            return self.tree.rebuild(list(outputs), list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
