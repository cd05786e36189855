"""A model's output structure, kept beside its flat graph outputs so a file can return it.

An exported file returns a flat list of tensors, where the model returned a dict, nested
tuples and lists, ``None`` or a number among its tensors (``{"logits": t, "aux": (a, None)}``).
:class:`OutputTree` records, at capture, the structure (``torch.utils._pytree``'s ``TreeSpec``,
written as its JSON form by ``treespec_dumps``: no pickle, and reading it back resolves only
the container types pytree registered) and what each leaf is: the graph's output ``i``, the
model's input ``i`` returned as it is, or a constant (``None``, a number, a string). A leaf is
matched to a graph output by identity: Dynamo builds the model's return value from the very
tensors its graph returns. :meth:`OutputTree.rebuild` puts a file's outputs back in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["OUTPUT_TREE_META", "OutputTree"]

#: ``gm.meta`` key: the captured model's :class:`OutputTree`, or the reason there is none (a str)
OUTPUT_TREE_META = "embedl_output_tree"

_KINDS = ("output", "input", "value")
_CONSTANTS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class OutputTree:
    """The structure of a model's return value over its graph's flat outputs.

    Attributes:
        spec: the pytree ``TreeSpec`` of the return value, as ``treespec_dumps``'s JSON.
        leaves: per leaf, ``("output", i)``, ``("input", i)`` or ``("value", constant)``.
        count: how many outputs the graph returns (a file with another count is another model).
    """

    spec: str
    leaves: tuple[tuple[str, Any], ...]
    count: int

    @classmethod
    def of(cls, returned: Any, graph_outputs: Sequence[Any], inputs: Sequence[Any]) -> OutputTree:
        """The tree of ``returned`` (what the captured model returned) over ``graph_outputs``
        (what its Dynamo graph returned on the same call) and ``inputs`` (its arguments).

        Raises:
            ValueError: a leaf is none of those, or the structure has no JSON form (a
                namedtuple or a class pytree cannot serialize); the message says which.
        """
        flat, spec = pytree.tree_flatten(returned)
        try:
            text = pytree.treespec_dumps(spec)
        except (NotImplementedError, TypeError, ValueError) as exc:
            raise ValueError(f"its structure has no JSON form ({exc})") from exc
        outputs = {id(t): i for i, t in reversed(list(enumerate(graph_outputs)))}
        args = {id(t): i for i, t in reversed(list(enumerate(inputs)))}
        leaves = []
        for index, leaf in enumerate(flat):
            if isinstance(leaf, torch.Tensor) and id(leaf) in outputs:
                leaves.append(("output", outputs[id(leaf)]))
            elif isinstance(leaf, torch.Tensor) and id(leaf) in args:
                leaves.append(("input", args[id(leaf)]))
            elif isinstance(leaf, _CONSTANTS):
                leaves.append(("value", leaf))
            else:
                raise ValueError(
                    f"leaf {index} is a {type(leaf).__name__} that is neither a graph output, "
                    "an input nor a constant"
                )
        return cls(text, tuple(leaves), len(graph_outputs))

    def rebuild(self, outputs: Sequence[Any], inputs: Sequence[Any]) -> Any:
        """The model's return value from a file's flat ``outputs`` and the call's ``inputs``."""
        values = [
            outputs[ref] if kind == "output" else inputs[ref] if kind == "input" else ref
            for kind, ref in self.leaves
        ]
        return pytree.tree_unflatten(values, pytree.treespec_loads(self.spec))

    @property
    def covers_outputs(self) -> bool:
        """Whether every graph output is a leaf (not so for a buffer Dynamo writes back)."""
        return {ref for kind, ref in self.leaves if kind == "output"} == set(range(self.count))

    def graph_outputs(self, returned: Any) -> tuple[Any, ...]:
        """The graph's outputs picked out of the model's return value (the inverse of
        :meth:`rebuild`): what the file returns, in its order.

        Raises:
            ValueError: ``returned`` has another structure, or the tree does not
                :attr:`cover <covers_outputs>` the graph's outputs.
        """
        flat, spec = pytree.tree_flatten(returned)
        if not self.covers_outputs or spec != pytree.treespec_loads(self.spec):
            raise ValueError("the return value does not have the recorded output structure")
        picked: list[Any] = [None] * self.count
        for (kind, ref), leaf in zip(self.leaves, flat):
            if kind == "output":
                picked[ref] = leaf
        return tuple(picked)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the sidecar's ``output_tree``)."""
        return {
            "spec": json.loads(self.spec),
            "leaves": [{kind: ref} for kind, ref in self.leaves],
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputTree:
        """The tree :meth:`to_dict` wrote.

        Raises:
            ValueError: ``data`` is not such a tree (the message says what is wrong).
        """
        try:
            spec = json.dumps(data["spec"])
            pytree.treespec_loads(spec)
            leaves = tuple(_leaf(entry) for entry in data["leaves"])
            count = data["count"]
        except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
            raise ValueError(f"not an output tree: {exc}") from exc
        if not isinstance(count, int) or any(
            kind in ("output", "input") and not (isinstance(ref, int) and ref >= 0)
            for kind, ref in leaves
        ):
            raise ValueError("not an output tree: an index is not a non-negative integer")
        if any(kind == "output" and ref >= count for kind, ref in leaves):
            raise ValueError(f"not an output tree: a leaf refers past its {count} outputs")
        return cls(spec, leaves, count)


def _leaf(entry: Any) -> tuple[str, Any]:
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise ValueError(f"a leaf is {entry!r}, not one of {{kind: reference}}")
    ((kind, ref),) = entry.items()
    if kind not in _KINDS:
        raise ValueError(f"a leaf's kind is {kind!r}; known: {', '.join(_KINDS)}")
    return kind, ref
