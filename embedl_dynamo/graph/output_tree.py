"""A model's output structure, kept beside its flat graph outputs so a file can return it.

An exported file returns a flat list of tensors, where the model returned a dict, nested
tuples and lists, ``None`` or a number among its tensors (``{"logits": t, "aux": (a, None)}``).
:class:`OutputTree` records, at capture, the structure (``torch.utils._pytree``'s ``TreeSpec``,
written as its JSON form by ``treespec_dumps``: no pickle, and reading it back resolves only
the container types pytree registered) and what each leaf is: the graph's output ``i``, the
model's input ``i`` returned as it is, or a constant (``None``, a number, a string). A leaf is
matched to a graph output by identity: Dynamo builds the model's return value from the very
tensors its graph returns. :meth:`OutputTree.rebuild` puts a file's outputs back in place.

A process that reads the tree may not have registered its container types: transformers
registers each ``ModelOutput`` class when its module is imported, and a fresh process running
``load()`` or a serving replica may not have imported it. A type named in the ``transformers``
package is imported from there (an installed package's module, never a file's code); any other
unknown type whose children are keyed by strings comes back as a ``dict`` with the same keys,
with one warning.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["OUTPUT_TREE_META", "OutputTree", "load_spec"]

#: ``gm.meta`` key: the captured model's :class:`OutputTree`, or the reason there is none (a str)
OUTPUT_TREE_META = "embedl_output_tree"

logger = logging.getLogger(__name__)

_KINDS = ("output", "input", "value")
_CONSTANTS = (type(None), bool, int, float, str)
#: packages whose output types are imported by name when a tree names one not yet registered
_TYPE_PACKAGES = ("transformers",)


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
        return pytree.tree_unflatten(values, load_spec(self.spec))

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
        if not self.covers_outputs or spec != load_spec(self.spec):
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
            load_spec(spec)
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


@functools.lru_cache(maxsize=64)
def load_spec(text: str) -> pytree.TreeSpec:
    """The ``TreeSpec`` of ``treespec_dumps``'s JSON ``text``, its unregistered types resolved
    as the module says (imported from a known package, else a ``dict``, with one warning).

    Example:
        >>> load_spec('[1, {"type": "builtins.list", "context": "null", "children_spec": []}]')
        TreeSpec(list, None, [])

    Raises:
        ValueError: the text is no tree, or names a type that is neither.
    """
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError:
        pass  # a type not registered in this process
    tree = json.loads(text)
    if not (isinstance(tree, list) and len(tree) == 2 and isinstance(tree[1], dict)):
        raise ValueError("not a pytree spec: expected [protocol, tree]")
    unknown = sorted(_unregistered_types(tree[1]))
    for name in unknown:
        _import_from_package(name)
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError:
        pass
    missing = sorted(_unregistered_types(tree[1]))
    as_dicts = json.dumps([tree[0], _as_dicts(tree[1], set(missing))])
    logger.warning(
        "the model returned %s, which this process has not registered with pytree (import "
        "the module that defines it first); its outputs come back as dicts with the same keys",
        ", ".join(missing),
    )
    return pytree.treespec_loads(as_dicts)


def _unregistered_types(node: Mapping[str, Any]) -> set[str]:
    kind = node.get("type")
    found = set() if kind is None or kind in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE else {kind}
    for child in node.get("children_spec", ()):
        found |= _unregistered_types(child)
    return found


def _import_from_package(type_name: str) -> None:
    """Import the module of ``type_name`` (``package.module.Class``) where it belongs to one of
    :data:`_TYPE_PACKAGES` and that package is installed: importing it registers the type."""
    module = type_name.rpartition(".")[0]
    package = module.partition(".")[0]
    if package not in _TYPE_PACKAGES or importlib.util.find_spec(package) is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        logger.debug("could not import %s for the output type %s: %s", module, type_name, exc)


def _as_dicts(node: dict[str, Any], missing: set[str]) -> dict[str, Any]:
    """``node`` with each type in ``missing`` made a ``dict`` over the same keys."""
    children = [_as_dicts(child, missing) for child in node.get("children_spec", ())]
    if node.get("type") not in missing:
        return {**node, "children_spec": children}
    keys = json.loads(node["context"]) if isinstance(node.get("context"), str) else None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"the output type {node['type']} is not registered with pytree here")
    return {"type": "builtins.dict", "context": node["context"], "children_spec": children}


def _leaf(entry: Any) -> tuple[str, Any]:
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise ValueError(f"a leaf is {entry!r}, not one of {{kind: reference}}")
    ((kind, ref),) = entry.items()
    if kind not in _KINDS:
        raise ValueError(f"a leaf's kind is {kind!r}; known: {', '.join(_KINDS)}")
    return kind, ref
