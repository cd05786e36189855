"""Record a :class:`~.weight_recipe.WeightRecipe` while a pipeline runs: which aten ops turn
the frozen graph's weights into the transformed graph's constants.

:func:`record_weights` is a ``TorchDispatchMode`` over the pipeline (the thread that runs it).
Each tensor it sees is in one of three states:

* **tracked** (a slot): a weight (a leaf), or the output of an op whose tensor inputs are all
  tracked or small literals (at most :data:`~.weight_recipe.LITERAL_ELEMENTS` elements, kept by
  value: an ``eps``, a shape). Such an op is written down, to be replayed;
* **tainted**: it depends on a weight through something a replay cannot repeat: an op that also
  reads a larger tensor that is no weight (an activation, so every calibration forward pass
  taints what it computes), or an argument a recipe cannot hold. A constant computed from it
  (SmoothQuant's smoothed weight) cannot be refitted;
* **untracked**: independent of the weights (calibration data, activation scales, literals).

A tensor object the mode did not see made (``nn.Parameter(t)`` shares ``t``'s memory without an
op) is found by its storage and geometry (offset, shape, strides, dtype) while that storage
lives; a view of a tracked storage in a geometry never seen is tainted, never taken as
independent. The pipeline reading a tracked weight's value into Python (``aten.item``,
``aten.equal``...) may decide on it in a way a replay cannot repeat: the recipe then has a
``problem`` and is never replayed. What the mode cannot see is a weight read through numpy
(``t.numpy()``): a constant computed that way looks independent; the refit's judge (the
artifact's outputs against the new weights' graph) is the net below that.

:meth:`WeightRecorder.finish` keeps the ops the models' constants need, and replays them on the
same weights: a recipe that does not give every derived constant bit for bit has a problem.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from embedl_dynamo.graph.weight_recipe import (
    WeightRecipe,
    encode_argument,
    tensor_digest,
)
from embedl_dynamo.graph.weight_tensors import (
    contiguous_strides,
    overwritten_destination,
    plain_tensor,
    replay_problem,
    slots_in,
    tensor_geometry,
    used_constants,
    written_arguments,
)

__all__ = ["WeightRecorder", "record_weights"]

# ops that read a tensor's value into Python: a decision on a weight a replay would not retake
_VALUE_READS = frozenset({"item", "_local_scalar_dense", "equal", "is_nonzero", "allclose"})


class WeightRecorder(TorchDispatchMode):
    """The mode :func:`record_weights` runs (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._slots: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._tainted: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._storages: dict[int, dict[tuple[Any, ...], int]] = {}  # id(storage) -> geometry
        self._tainted_storages: dict[int, str] = {}
        self._storage_refs: dict[int, Any] = {}
        self._group: dict[int, int] = {}  # id(storage) -> its group number (for pruning)
        self._groups = itertools.count()
        self._leaf_tensors: dict[str, torch.Tensor] = {}
        self.slot_group: list[int] = []
        self.leaves: dict[str, dict[str, Any]] = {}
        self.ops: list[list[Any]] = []
        self.problem: str | None = None

    # -- states -----------------------------------------------------------------------------
    def _watch(self, t: torch.Tensor) -> int:
        """Register ``t``'s storage (forgotten when it is freed); its group number."""
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._storage_refs:

            def forget(_ref: Any, key: int = key) -> None:
                for table in (
                    self._storages,
                    self._tainted_storages,
                    self._storage_refs,
                    self._group,
                ):
                    table.pop(key, None)

            self._storage_refs[key] = weakref.ref(storage, forget)
            self._group[key] = next(self._groups)
        return self._group[key]

    def slot_of(self, t: torch.Tensor) -> int | None:
        """The slot of a tracked tensor, or None."""
        slot = self._slots.get(t)
        if not plain_tensor(t):
            return slot
        key = id(t.untyped_storage())
        if key not in self._storage_refs or key in self._tainted_storages:
            return None  # a storage written with something a replay cannot repeat
        return slot if slot is not None else self._storages.get(key, {}).get(tensor_geometry(t))

    def taint_of(self, t: torch.Tensor) -> str | None:
        """Why ``t`` depends on a weight in a way a replay cannot repeat, or None."""
        why = self._tainted.get(t)
        if why is not None or not plain_tensor(t):
            return why
        key = id(t.untyped_storage())
        if key not in self._storage_refs:
            return None
        if key in self._tainted_storages:
            return self._tainted_storages[key]
        if self._slots.get(t) is None and tensor_geometry(t) not in self._storages.get(key, {}):
            return "a view of a weight the recorder did not see made"
        return None

    def _track(self, t: torch.Tensor) -> int:
        slot = len(self.slot_group)
        group = self._watch(t) if plain_tensor(t) else -1 - slot
        self.slot_group.append(group)
        self._slots[t] = slot
        if plain_tensor(t):
            self._storages.setdefault(id(t.untyped_storage()), {})[tensor_geometry(t)] = slot
        return slot

    def _taint(self, t: torch.Tensor, why: str) -> None:
        self._tainted[t] = why
        self._slots.pop(t, None)
        if plain_tensor(t):
            self._watch(t)
            self._tainted_storages.setdefault(id(t.untyped_storage()), why)

    # -- recording --------------------------------------------------------------------------
    def leaf(self, name: str, tensor: torch.Tensor) -> None:
        """Register a weight the recipe reads, by name."""
        slot = self.slot_of(tensor)
        if slot is None or self._slots.get(tensor) is None:
            slot = self._track(tensor)
        spec = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).split(".")[-1]}
        self.leaves[name] = {**spec, "slot": slot}
        self._leaf_tensors[name] = tensor

    def _state(self, value: Any) -> tuple[int | None, str | None]:
        """A tensor's or storage's slot (tracked) and taint (see the module)."""
        if isinstance(value, torch.Tensor):
            return self.slot_of(value), self.taint_of(value)
        key = id(value)
        if key not in self._storage_refs:
            return None, None
        if key in self._tainted_storages:
            return None, self._tainted_storages[key]
        return self._whole_slot(value), None

    def _whole_slot(self, storage: Any) -> int:
        """The slot of a tensor that covers all of ``storage`` (a deepcopy reads its bytes);
        -1 where the storage is tracked through views only."""
        for (offset, shape, stride, dtype), slot in self._storages.get(id(storage), {}).items():
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            if offset == 0 and nbytes == storage.nbytes() and stride == contiguous_strides(shape):
                return slot
        return -1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:  # what the op reads, before it runs (set_ and copy_ change their first argument)
            seen = self._inputs(func, args, kwargs)
        except Exception as exc:  # the pipeline must never fail for the recorder
            self.problem = self.problem or f"recording {func} failed: {type(exc).__name__}: {exc}"
            seen = None
        out = func(*args, **kwargs)
        if seen is not None:
            try:
                self._outputs(func, args, kwargs, out, *seen)
            except Exception as exc:
                self.problem = self.problem or f"recording {func} failed: {exc}"
        return out

    def _inputs(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, list[Any]] | None:
        """Before ``func`` runs: None when it reads no weight, else why its outputs are tainted
        (None: they are tracked) and the op as it is written down."""
        kinds = (torch.Tensor, torch.UntypedStorage)
        items = [v for v in tree_leaves((args, kwargs)) if isinstance(v, kinds)]
        states = [self._state(v) for v in items]
        if all(s is None and w is None for s, w in states):
            return None  # independent of the weights
        name = func.name().split("::")[-1].split(".")[0]
        if name in _VALUE_READS and any(s is not None and w is None for s, w in states):
            self.problem = self.problem or f"the pipeline read a weight's value ({func})"
        why = next((w for _, w in states if w is not None), None)
        if why is None and func.namespace != "aten":
            why = f"{func} is not an aten op"
        if why is not None:
            return why, []
        fresh = overwritten_destination(func, args, states)

        def tracked(value: Any) -> dict[str, Any] | None:
            if value is fresh:
                return {
                    "empty": {
                        "shape": list(value.shape),
                        "stride": list(value.stride()),
                        "dtype": str(value.dtype).split(".")[-1],
                    }
                }
            slot, _ = self._state(value)
            if slot == -1:
                raise TypeError("a weight's storage read whole through a view")
            key = "slot" if isinstance(value, torch.Tensor) else "storage_of"
            return None if slot is None else {key: slot}

        try:
            encoded = [
                str(func),
                encode_argument(list(args), tracked),
                {k: encode_argument(v, tracked) for k, v in kwargs.items()},
            ]
        except TypeError as exc:  # an argument a recipe cannot hold as data
            return f"{func} reads {exc}", []
        written = [self.slot_of(t) for t in written_arguments(func, args, kwargs)]
        return None, [*encoded, [s for s in written if s is not None]]

    def _outputs(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        why: str | None,
        encoded: list[Any],
    ) -> None:
        """After ``func`` ran: its outputs tracked (the op written down) or tainted."""
        outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        if why is not None:
            for t in [*outputs, *written_arguments(func, args, kwargs)]:
                self._taint(t, why)
            return
        if not isinstance(out, (torch.Tensor, tuple, list)) and out is not None:
            return  # a number or bool: the value read is noted above
        name, arguments, keywords, written = encoded
        slots = [self._output_slot(o, written) for o in outputs]
        # a copy in the source's own layout, which a replay may take as a view (see _needed)
        same = func is torch.ops.aten.clone.default and outputs[0].stride() == args[0].stride()
        self.ops.append([name, arguments, keywords, slots, written, same])

    def _output_slot(self, tensor: torch.Tensor, written: list[int | None]) -> int:
        """The slot an op's output fills: a written argument's own (in place; ``set_`` may
        have moved it to another storage), else a new one."""
        slot = self._slots.get(tensor)
        if slot is None or slot not in written:
            return self._track(tensor)
        if plain_tensor(tensor):
            self.slot_group[slot] = self._watch(tensor)
            self._storages.setdefault(id(tensor.untyped_storage()), {})[tensor_geometry(tensor)] = (
                slot
            )
        return slot

    # -- the recipe -------------------------------------------------------------------------
    def finish(self, models: Mapping[str, nn.Module], check: bool = True) -> WeightRecipe:
        """The recipe of each model's constants (named as ``named_parameters`` and
        ``named_buffers`` name them), pruned to the ops they need; with ``check``, replayed on
        the recorded weights, and given a problem unless it computes every derived constant
        bit for bit (a replay costs about what the pipeline's own weight ops cost)."""
        outputs: dict[str, dict[str, dict[str, Any]]] = {}
        independent: dict[str, dict[str, str]] = {}
        live: dict[str, dict[str, torch.Tensor]] = {}
        for model, module in models.items():
            outputs[model], independent[model], live[model] = {}, {}, {}
            for name, tensor in used_constants(module):
                slot, why = self.slot_of(tensor), self.taint_of(tensor)
                if slot is not None:
                    outputs[model][name] = {"slot": slot}
                    live[model][name] = tensor
                elif why is not None:
                    outputs[model][name] = {"tainted": why}
                else:
                    independent[model][name] = tensor_digest(tensor)
        recipe = WeightRecipe(
            self.leaves,
            self._needed(outputs),
            outputs,
            independent,
            len(self.slot_group),
            self.problem,
        )
        if check and recipe.problem is None:
            recipe.problem = replay_problem(recipe, live, self._leaf_tensors)
        self._leaf_tensors = {}
        return recipe

    def _needed(self, outputs: dict[str, dict[str, dict[str, Any]]]) -> list[list[Any]]:
        """The ops the outputs need, in order: backwards from the outputs' storages (an op
        that writes into a storage changes every view of it). A clone in its source's layout
        (the pipeline's deep copies of a graph) whose source and copy nothing writes into
        afterwards is replayed as a view of its source: the same values, no copy."""
        slot_group = self.slot_group
        groups = {
            slot_group[o["slot"]] for c in outputs.values() for o in c.values() if "slot" in o
        }
        written_after: set[int] = set()
        kept = []
        for name, args, kwargs, outs, written, same_layout in reversed(self.ops):
            if not any(slot_group[s] in groups for s in [*outs, *written]):
                continue
            inputs = list(slots_in((args, kwargs)))
            groups |= {slot_group[s] for s in inputs}
            written_after |= {slot_group[s] for s in written}
            unwritten = not {slot_group[s] for s in [*outs, *inputs]} & written_after
            if same_layout and unwritten:
                name, args, kwargs = "aten.alias.default", args[:1], {}
            kept.append([name, args, kwargs, outs])
        kept.reverse()
        return kept


@contextlib.contextmanager
def record_weights(weights: Mapping[str, torch.Tensor]) -> Iterator[WeightRecorder]:
    """Record, on this thread, the ops that derive constants from ``weights`` (name ->
    tensor: a frozen graph's constants); call :meth:`WeightRecorder.finish` after."""
    recorder = WeightRecorder()
    for name, tensor in weights.items():
        recorder.leaf(name, tensor)
    with recorder:
        yield recorder
