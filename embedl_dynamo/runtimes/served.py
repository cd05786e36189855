"""What a compiled model calls: a runtime's inference, whose first call may reuse the outputs
of the build's check (:meth:`~embedl_dynamo.runtimes.base.Runtime.check_artifact`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from embedl_dynamo.cache.keys import version_of

__all__ = ["CheckedCall", "Inference", "Served"]

#: the check's call: its sample, the sample's version counters
#: (:func:`~embedl_dynamo.cache.keys.version_of`: None for an inference tensor, which keeps
#: none; nothing runs between Dynamo's compile and its first call to modify it), its outputs
CheckedCall = tuple[tuple[Any, ...], tuple[int | None, ...], tuple[Any, ...]]


class Inference(Protocol):
    """What :class:`Served` calls: :meth:`~embedl_dynamo.runtimes.base.Runtime.infer`."""

    def infer(
        self, *args: torch.Tensor, in_place: Mapping[int, int] | None = None
    ) -> tuple[torch.Tensor, ...]: ...


class Served:
    """What a compiled model calls: its runtime's ``infer``.

    A first call on the very sample the runtime's ``check_artifact`` ran (the same tensor
    objects, unmodified: Dynamo calls the compiled graph with the inputs it compiled it for)
    returns the outputs the check computed, where they are the tensors this call would make
    (:func:`_reusable`). :meth:`writing_in_place` gives the callable that lets the runtime
    write some outputs straight into their inputs.
    """

    def __init__(
        self,
        runtime: Inference,
        checked: CheckedCall | None = None,
        in_place: Mapping[int, int] | None = None,
    ) -> None:
        self.runtime = runtime
        self.in_place = dict(in_place or {})
        self._checked = checked

    def writing_in_place(self, in_place: Mapping[int, int]) -> Served:
        """This callable, with the outputs ``in_place`` maps to (input position -> output
        position, negative from the end) written into their inputs' tensors where the runtime
        can (``Runtime.infer``). The checked first call moves to the new callable."""
        checked, self._checked = self._checked, None
        return Served(self.runtime, checked, in_place)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        checked, self._checked = self._checked, None
        if checked is not None and _reusable(checked, args):
            return checked[2]
        if self.in_place:
            return self.runtime.infer(*args, in_place=self.in_place)
        return self.runtime.infer(*args)


def _reusable(checked: CheckedCall, args: Sequence[Any]) -> bool:
    """Whether the check's outputs are this call's: its arguments are the sample's tensors,
    unmodified, and the outputs are the kind of tensor the call makes, as eager's ops would:
    inference tensors under ``torch.inference_mode``, ordinary ones outside it.

    Dynamo compiles outside inference mode, so the check's outputs are ordinary tensors even
    when the call that triggered the compile runs under it. Handed to the caller, they become
    a model's state (a KV cache, the cache's lazily made tensors), and Dynamo's guards on the
    dispatch keys of the next calls' inputs then fail on the inference tensors of every later
    call: each compiled graph was built again in a second ``generate()`` under inference mode.
    """
    sample, versions, outputs = checked
    inference = torch.is_inference_mode_enabled()
    return (
        len(args) == len(sample)
        and all(a is s and version_of(a) == v for a, s, v in zip(args, sample, versions))
        and all(t.is_inference() == inference for t in outputs if isinstance(t, torch.Tensor))
    )
