"""Whether the weights a build froze are still the caller's weights, checked on every call.

A compiled subgraph holds copies of its weights (ONNX initializers, an engine's constants), so
each call first asks whether the caller's parameters and buffers are the tensors it froze, with
the values it froze:

* **identity and version counter** (``id``, ``_version``): a new Parameter, ``load_state_dict``,
  an optimizer step, ``p.mul_(2)`` or ``p.copy_(new)`` under ``no_grad``, ``nn.init``;
* **memory address** (``data_ptr()``): ``p.data = new`` and
  ``torch.nn.utils.vector_to_parameters`` give the same Parameter new memory, without a
  version bump;
* **a sample of the bytes** (:class:`ByteSample`): an in-place write through ``.data``
  (``p.data.mul_(2)``, ``p.data.copy_(new)``, ``buf.data.add_(1)``) changes the memory through a
  tensor with a version counter of its own, so only the values can tell. A weight of at most
  :data:`SMALL_BYTES` bytes is compared whole; a larger one in :data:`SAMPLED_RUNS` runs of
  :data:`RUN_BYTES` bytes (a cache line each: 16 float32 values) spread evenly over its memory
  from the first to the last byte. Reading a run costs about what one word costs (one cache
  miss), so a decoder's hundreds of weights are checked in a fraction of what as many words
  spread apart would take. A ``.data`` write that changes none of the sampled bytes is not
  seen.

What is not seen: such a write outside the sample, and ``p.data`` replaced by another view of
the same memory at the same address (``p.data = p.data.t()`` of a square weight), which
Dynamo's own guards on strides see unless they are skipped.

Each call costs three C-level ``map``s over the weights, one concatenation of the sampled
views (made once, over each weight's storage; a second one only for weights of fewer than 8
bytes) and one comparison of the concatenated bytes (:class:`ByteSample`). The views keep the sampled weights' memory alive as long as the build is kept.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import numpy
import torch

__all__ = [
    "SAMPLED_BYTES",
    "RUN_BYTES",
    "SAMPLED_RUNS",
    "SMALL_BYTES",
    "ByteSample",
    "FrozenWeights",
    "byte_span",
]

#: a weight of at most this many bytes is compared whole
SMALL_BYTES = 1024
#: a larger weight is compared in this many runs of RUN_BYTES, spread evenly over its memory
SAMPLED_RUNS = 4
RUN_BYTES = 64
_WORD = 8  # bytes compared as one int64
#: what :meth:`FrozenWeights.changed` returns for a write seen only in the sampled bytes
SAMPLED_BYTES = "the sampled bytes"

_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The first byte of ``tensor`` in its storage and the length of the memory it spans."""
    size = tensor.element_size()
    if tensor.is_contiguous():
        return tensor.storage_offset() * size, tensor.nbytes
    if tensor.numel() == 0:
        return tensor.storage_offset() * size, 0
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if n > 1)
    return tensor.storage_offset() * size, (last + 1) * size


def _sample_views(tensor: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """Views of ``tensor``'s memory to compare, each with the width of its group in bytes
    (0: a 1-d view of fewer than 8 bytes); none for a tensor without plain storage."""
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return []
    try:
        storage = tensor.untyped_storage()
    except (NotImplementedError, RuntimeError):  # a tensor subclass without storage
        return []
    start, length = byte_span(tensor)
    if length == 0:
        return []
    with torch.no_grad():
        raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    if length < _WORD:
        return [(0, raw.as_strided((length,), (1,), start))]
    if length <= SMALL_BYTES:  # whole: its words, and its last 8 bytes when 8 does not divide
        views = [(_WORD, raw.as_strided((length // _WORD, _WORD), (_WORD, 1), start))]
        if length % _WORD:
            views.append((_WORD, raw.as_strided((1, _WORD), (_WORD, 1), start + length - _WORD)))
        return views
    step = (length - RUN_BYTES) // (SAMPLED_RUNS - 1)
    return [(RUN_BYTES, raw.as_strided((SAMPLED_RUNS, RUN_BYTES), (step, 1), start))]


class ByteSample:
    """Sampled bytes of some tensors (see the module), compared with those read at creation.

    CPU views are read through numpy: its concatenation and a ``bytes`` comparison cost a
    fraction of torch's, whose ops would also wake torch's thread pool between two
    inferences; other devices' through torch, as int64 words."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        groups: dict[tuple[bool, int], list[Any]] = {}
        for tensor in tensors:
            for width, view in _sample_views(tensor):
                on_cpu = view.device.type == "cpu"
                groups.setdefault((on_cpu, width), []).append(view.numpy() if on_cpu else view)
        # (views, their bytes at creation): one concatenation and one comparison a group
        self._arrays = [
            (v, numpy.concatenate(v).tobytes()) for (cpu, _), v in groups.items() if cpu
        ]
        self._tensors = [(v, _words(w, v)) for (cpu, w), v in groups.items() if not cpu]

    def unchanged(self) -> bool:
        """Whether every sampled byte holds the value it held at creation."""
        for arrays, reference in self._arrays:
            if numpy.concatenate(arrays).tobytes() != reference:
                return False
        for views, words in self._tensors:
            if not torch.equal(torch.cat(views).view(words.dtype), words):
                return False
        return True


def _words(width: int, views: list[torch.Tensor]) -> torch.Tensor:
    """The views' bytes in one tensor, as int64 words where they are 8 bytes wide."""
    joined = torch.cat(views)
    return joined.view(torch.int64) if width else joined


class FrozenWeights:
    """Identity, version counter, address and sampled bytes of every frozen weight among
    Dynamo's arguments (see the module).

    Checked on every call, so with C-level ``map`` and tuple comparison rather than a Python
    loop, whose per-weight overhead would add up on models with hundreds of weights. Held by
    weak reference: once one of them is freed its ``id`` may be given to another tensor, so
    the set never matches again (``freed``), and the caller's model is not kept alive.
    """

    def __init__(self, args: Sequence[Any], user: list[int]) -> None:
        self.user = user  # the arguments that are not weights
        users = set(user)
        self.indices = [
            i for i, t in enumerate(args) if i not in users and isinstance(t, torch.Tensor)
        ]
        # a tensor subclass without storage has no address: identity and version only
        self.addressed = [i for i in self.indices if _has_address(args[i])]
        self.ids, self.versions, self.addresses = self._state(args)
        self.sample = ByteSample(_pick(args, self.indices))
        self.freed = False
        self._refs = [weakref.ref(args[i], self._on_free) for i in self.indices]

    def _on_free(self, _ref: Any) -> None:
        self.freed = True

    def may_match_again(self, newer: FrozenWeights) -> bool:
        """False when this set can never match a call again: a weight was freed, or ``newer``
        holds the same tensors (modified since)."""
        return not self.freed and self.ids != newer.ids

    def _state(self, args: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        tensors = _pick(args, self.indices)
        addressed = tensors if len(self.addressed) == len(tensors) else _pick(args, self.addressed)
        return (
            tuple(map(id, tensors)),
            tuple(map(_VERSION, tensors)),
            tuple(map(_DATA_PTR, addressed)),
        )

    def changed(self, args: Sequence[Any]) -> str | None:
        """What changed since the build: the first weight replaced, modified in place or given
        new memory, ``"the sampled bytes"`` of a write the version counters missed
        (``.data``), or None."""
        ids, versions, addresses = self._state(args)
        if (ids, versions, addresses) == (self.ids, self.versions, self.addresses):
            if not self.freed:
                return None if self.sample.unchanged() else SAMPLED_BYTES
        for index, now, then in zip(self.indices, zip(ids, versions), zip(self.ids, self.versions)):
            if now != then:
                return f"argument {index}"
        for index, now, then in zip(self.addressed, addresses, self.addresses):
            if now != then:
                return f"argument {index} (new memory)"
        return "a weight"


def _pick(args: Sequence[Any], indices: list[int]) -> tuple[Any, ...]:
    if len(indices) > 1:
        return operator.itemgetter(*indices)(args)
    return tuple(args[i] for i in indices)


def _has_address(tensor: torch.Tensor) -> bool:
    try:
        tensor.data_ptr()
    except (NotImplementedError, RuntimeError):
        return False
    return True
