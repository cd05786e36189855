"""The variants a suite times against each other: ours, PyTorch's and the peers', as plug-ins.

A variant is built for a :class:`Case` (one model, its inputs and calibration batches, a
work directory, the suite's settings) by a builder that returns a :class:`Built`: the call to
time (built, not yet called), a ``describe`` that reads what the variant reported after its
first call (where ours ran, its INT8 layers), and the ``tool`` that ran it (a peer's name and
version). Names:

* ``eager``, ``inductor`` (``torch.compile`` with freezing): :mod:`.pytorch`;
* ``ov_f32``, ``ov_default``, ``ov_bf16`` (OpenVINO's own conversion with that precision hint;
  ``default``: OpenVINO's own choice, bf16 on a CPU with AVX512_BF16 or AMX) and
  ``nncf_int8``, ``nncf_int8_f32``, ``nncf_int8_bf16`` (NNCF's INT8 of that conversion, the
  default hints or a hint): :mod:`.openvino`, one conversion per case shared by its hints;
* ``ort_int8``: ONNX Runtime's ``quantize_static``, :mod:`.ort_quantize`;
* ``ours-<precision>[@<target>]``: ``torch.compile(model, backend="embedl_<target>")`` at that
  precision (the suite's ``--backend`` when no target is named), :mod:`.ours`.

Peers that time themselves in their own environment (llama.cpp, optimum-intel's OpenVINO
pipeline) are :mod:`.llm_peers`. This module imports no torch (a builder's module is imported
when it builds).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Built", "Case", "builder", "check_names", "known_names", "memo"]


@dataclass
class Case:
    """What every variant of one measurement is built for."""

    model: Any
    inputs: tuple[Any, ...]
    calibration: list[tuple[Any, ...]]
    family: str  # cnn, transformer, tiny, ...: the peers' model type
    workdir: str  # our cache (cold compiles) and the peers' files; removed after the case
    backend: str = "embedl_tensorrt"
    accuracy_budget: float | None = None
    shared: dict[str, Any] = field(default_factory=dict)  # conversions shared by variants


@dataclass
class Built:
    """A variant ready to time: its call, what it reports after a call, the tool it is."""

    call: Callable[[], Any]
    describe: Callable[[], dict[str, Any]] | None = None
    tool: str | None = None


_FIXED = {
    "eager": "bench.variants.pytorch:build",
    "inductor": "bench.variants.pytorch:build",
    "ort_int8": "bench.variants.ort_quantize:build",
    **{
        name: "bench.variants.openvino:build"
        for name in (
            "ov_f32",
            "ov_default",
            "ov_bf16",
            "nncf_int8",
            "nncf_int8_f32",
            "nncf_int8_bf16",
        )
    },
}
_OURS = "bench.variants.ours:build"


def known_names() -> list[str]:
    """The fixed names, and the pattern of ours."""
    return [*_FIXED, "ours-<precision>[@<target>]"]


def builder(name: str) -> Callable[[Case, str], Built]:
    """The builder of variant ``name`` (called as ``builder(name)(case, name)``).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    target = _OURS if name.startswith("ours-") else _FIXED.get(name)
    if target is None:
        raise ValueError(f"no variant {name!r}; known: {', '.join(known_names())}")
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def check_names(names: list[str]) -> None:
    """Raise ValueError naming the first unknown variant of ``names``."""
    for name in names:
        if not (name.startswith("ours-") or name in _FIXED):
            raise ValueError(f"no variant {name!r}; known: {', '.join(known_names())}")


def memo(case: Case, key: str, make: Callable[[], Any]) -> Any:
    """``make()`` once per case under ``key`` (a conversion several variants share); a
    failure is kept too, and raised again for each variant that asks."""
    if key not in case.shared:
        try:
            case.shared[key] = make()
        except Exception as error:  # every variant of the conversion fails with it
            case.shared[key] = error
    found = case.shared[key]
    if isinstance(found, Exception):
        raise found
    return found
