"""A weight recipe: the tensor ops that turn a frozen graph's weights into a transformed
graph's constants, kept as data and replayed on new weights (refit).

A pipeline derives constants from the weights it is given: BatchNorm folded into a convolution
(``w * gamma / sqrt(var + eps)`` in float64), a weight's INT8 scales (its amax per channel over
127), half copies, clones. :mod:`.weight_recorder` writes down those ops as the pipeline runs
them (aten ops, as PyTorch's dispatcher sees them); :meth:`WeightRecipe.replay` runs the very
same ops, in the same order, on other weights of the same shapes and dtypes: the same kernels
on the same dtypes, so the constants are bit for bit what the pipeline computes from those
weights, without matching a pattern, calibrating or exporting again.

What a recipe holds is data only (JSON: op names, slot numbers, literals), never a pickle:

* ``leaves``: the frozen graph's constants it reads, by name, with shape and dtype;
* ``ops``: ``[op, args, kwargs, outputs]``: an aten op by name (``aten.mul.Tensor``), its
  arguments with each tensor a slot (``{"slot": 3}``), a small literal tensor by value, or a
  scalar, dtype or device; the slots its outputs fill;
* ``outputs``: per transformed model (``model``, ``float_model``), each constant derived from
  the leaves (``{"slot": n}``), or ``{"tainted": why}`` where it depends on the weights through
  something a replay cannot repeat (activations: SmoothQuant's factors), and the digest of
  each constant that does not depend on them (``independent``: activation scales, shapes);
* ``problem``: why the recipe cannot be replayed at all (the pipeline read a weight's value
  into Python and may have decided on it), or None;
* ``state_dict`` and ``kept``: the keys of the exported model's ``state_dict`` (None: not
  recorded), and the digest of each constant computed from its non-persistent buffers alone,
  which a refit from a ``state_dict`` keeps (:mod:`.non_persistent`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "RECIPE_FORMAT",
    "WeightRecipe",
    "decode_argument",
    "digest_kind",
    "encode_argument",
    "tensor_digest",
]

RECIPE_FORMAT = "embedl_dynamo.weight_recipe/1"
#: an untracked tensor argument of at most this many elements is kept by value (a literal)
LITERAL_ELEMENTS = 64
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _number(value: float) -> Any:
    return value if math.isfinite(value) else str(value)


def encode_argument(value: Any, tracked: Callable[[Any], dict[str, Any] | None]) -> Any:
    """``value`` (an op argument) as JSON data; ``tracked(tensor or storage)`` gives a weight's
    encoded form (``{"slot": n}``...) or None. Raises ``TypeError`` for what a recipe
    cannot hold."""
    if isinstance(value, (torch.Tensor, torch.UntypedStorage)):
        found = tracked(value)
        if found is not None:
            return found
        if isinstance(value, torch.UntypedStorage):
            raise TypeError("a storage that is no weight's")
        if value.numel() > LITERAL_ELEMENTS or value.device.type == "meta":
            raise TypeError(f"a {tuple(value.shape)} tensor that is no weight")
        flat = value.detach().reshape(-1)
        values = [_number(float(v)) if flat.is_floating_point() else v for v in flat.tolist()]
        return {"tensor": values, "dtype": _dtype_name(value.dtype), "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": _number(value)}
    if isinstance(value, (list, tuple)):
        return [encode_argument(v, tracked) for v in value]
    for kind, cls in (
        ("dtype", torch.dtype),
        ("device", torch.device),
        ("layout", torch.layout),
        ("memory_format", torch.memory_format),
    ):
        if isinstance(value, cls):
            return {kind: str(value).split(".")[-1]}
    raise TypeError(f"an argument of type {type(value).__name__}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def _whole_storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    """The storage of a tensor that covers all of it (a replay reads it by its bytes)."""
    storage = tensor.untyped_storage()
    whole = tensor.is_contiguous() and tensor.storage_offset() == 0
    if not whole or tensor.numel() * tensor.element_size() != storage.nbytes():
        raise ValueError("weight recipe: a weight is a view into a larger storage")
    return storage


def decode_argument(data: Any, slots: Sequence[torch.Tensor | None]) -> Any:
    """The op argument :func:`encode_argument` wrote, tensors taken from ``slots``."""
    if isinstance(data, list):
        return [decode_argument(v, slots) for v in data]
    if not isinstance(data, dict):
        return data
    for key in ("slot", "storage_of"):
        if key in data:
            tensor = slots[data[key]]
            if tensor is None:
                raise ValueError(f"weight recipe: slot {data[key]} read before it is written")
            return tensor if key == "slot" else _whole_storage(tensor)
    if "empty" in data:  # a tensor an op overwrites whole (the copy of a deepcopy)
        spec = data["empty"]
        return torch.empty_strided(
            spec["shape"], spec["stride"], dtype=getattr(torch, spec["dtype"])
        )
    if "tensor" in data:
        dtype = getattr(torch, data["dtype"])
        values = [_NON_FINITE.get(v, v) if isinstance(v, str) else v for v in data["tensor"]]
        return torch.tensor(values, dtype=dtype).reshape(data["shape"])
    if "float" in data:
        value = data["float"]
        return _NON_FINITE[value] if isinstance(value, str) else float(value)
    if "dtype" in data:
        return getattr(torch, data["dtype"])
    if "device" in data:
        return torch.device(data["device"])
    if "layout" in data:
        return getattr(torch, data["layout"])
    if "memory_format" in data:
        return getattr(torch, data["memory_format"])
    raise ValueError(f"weight recipe: unknown argument {data!r}")


def tensor_digest(tensor: torch.Tensor) -> str:
    """``dtype|shape|sha256`` of a tensor's bytes (contiguous, row-major): equal for equal
    tensors, and comparable by its first two parts without hashing."""
    h = hashlib.sha256()
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return f"{_dtype_name(tensor.dtype)}|{list(tensor.shape)}|{h.hexdigest()}"


def digest_kind(digest: str) -> str:
    """The ``dtype|shape`` part of a :func:`tensor_digest`."""
    return digest.rsplit("|", 1)[0]


def _op(name: str) -> Any:
    """The aten ``OpOverload`` named ``aten.mul.Tensor``; ValueError for any other namespace."""
    namespace, op, overload = name.split(".")
    if namespace != "aten":
        raise ValueError(f"weight recipe: {name} is not an aten op")
    return getattr(getattr(torch.ops.aten, op), overload)


@dataclass
class WeightRecipe:
    """The recorded ops from ``leaves`` to each model's constants (see the module).

    Attributes:
        leaves: name -> ``{"shape": [...], "dtype": "float32", "slot": n}``.
        ops: ``[op name, args, kwargs, output slots]`` in the order they ran.
        outputs: model -> constant name -> ``{"slot": n}`` or ``{"tainted": why}``.
        independent: model -> constant name -> the digest of a constant no weight decides
            (:func:`tensor_digest`).
        slots: how many slots the ops fill.
        problem: why the recipe cannot be replayed, or None.
        state_dict: the keys of the exported model's ``state_dict``, or None (not recorded).
        kept: model -> constant -> its digest at export, for the constants computed from
            non-persistent buffers alone (:mod:`.non_persistent`).
    """

    leaves: dict[str, dict[str, Any]]
    ops: list[list[Any]]
    outputs: dict[str, dict[str, dict[str, Any]]]
    independent: dict[str, dict[str, str]] = field(default_factory=dict)
    slots: int = 0
    problem: str | None = None
    state_dict: list[str] | None = None
    kept: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as JSON data (:meth:`from_dict` reads it back)."""
        return {
            "format": RECIPE_FORMAT,
            "leaves": self.leaves,
            "ops": self.ops,
            "outputs": self.outputs,
            "independent": self.independent,
            "slots": self.slots,
            "problem": self.problem,
            "state_dict": self.state_dict,
            "kept": self.kept,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightRecipe:
        """A recipe from :meth:`to_dict`'s data; ValueError for anything else."""
        if not isinstance(data, Mapping) or data.get("format") != RECIPE_FORMAT:
            raise ValueError(f"not a weight recipe of format {RECIPE_FORMAT}")
        return cls(
            dict(data["leaves"]),
            list(data["ops"]),
            dict(data["outputs"]),
            dict(data.get("independent") or {}),
            int(data["slots"]),
            data.get("problem"),
            None if data.get("state_dict") is None else list(data["state_dict"]),
            dict(data.get("kept") or {}),
        )

    def tainted(self, model: str) -> dict[str, str]:
        """The constants of ``model`` the weights decide but a replay cannot compute, and why."""
        return {n: o["tainted"] for n, o in self.outputs.get(model, {}).items() if "tainted" in o}

    def missing(self, weights: Mapping[str, torch.Tensor]) -> list[str]:
        """The leaves ``weights`` lack, in the recipe's order."""
        return [name for name in self.leaves if weights.get(name) is None]

    def leaf_problem(self, weights: Mapping[str, torch.Tensor]) -> str | None:
        """Why ``weights`` cannot replace the recorded leaves (one missing, or another shape or
        dtype), or None."""
        missing = self.missing(weights)
        if missing:
            return f"weight {missing[0]} is missing"
        for name, spec in self.leaves.items():
            tensor = weights[name]
            dtype = _dtype_name(tensor.dtype)
            if list(tensor.shape) != list(spec["shape"]) or dtype != spec["dtype"]:
                return (
                    f"weight {name} is {dtype}{list(tensor.shape)}, compiled as "
                    f"{spec['dtype']}{list(spec['shape'])}"
                )
        return None

    def replay(self, weights: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
        """Each model's derived constants (by name) computed from ``weights`` (by leaf name).

        Raises:
            ValueError: the recipe has a :attr:`problem`, or ``weights`` do not fit its leaves
                (:meth:`leaf_problem`).
        """
        if self.problem is not None:
            raise ValueError(f"weight recipe cannot be replayed: {self.problem}")
        why = self.leaf_problem(weights)
        if why is not None:
            raise ValueError(why)
        slots: list[torch.Tensor | None] = [None] * self.slots
        for name, spec in self.leaves.items():
            slots[spec["slot"]] = weights[name].detach()
        with torch.no_grad():
            for name, args, kwargs, outs in self.ops:
                result = _op(name)(
                    *decode_argument(args, slots),
                    **{k: decode_argument(v, slots) for k, v in kwargs.items()},
                )
                results = result if isinstance(result, (tuple, list)) else (result,)
                for slot, value in zip(outs, results):
                    if slot is not None:
                        slots[slot] = value
        return {
            model: {n: slots[o["slot"]] for n, o in constants.items() if "slot" in o}
            for model, constants in self.outputs.items()
        }
