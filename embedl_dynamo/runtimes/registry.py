"""The runtime registry: the one list of runtime classes, and which of them runs a graph.

The built-in runtimes are listed in :data:`BUILTIN_RUNTIMES`; third-party runtimes plug in
through the ``embedl_dynamo.runtimes`` entry-point group (a :class:`~.base.Runtime` subclass, or
a callable returning one) or :func:`register_runtime`. A name registered twice is refused. Every
fact about a runtime (device, version, profiler, lint, CPU placement) is declared by its class.

``auto`` takes the runtimes the target names (``Backend.runtimes``; every registered runtime,
highest :attr:`~.base.Runtime.auto_rank` first, for a target that names none), drops those not
installed and, for a graph whose tensors are not on a CUDA device, the CUDA-only ones (a CPU
model stays on the CPU: copying every call's inputs to a GPU and back is not what a CPU caller
asked for), and for a graph on a CUDA device those that would run it on the CPU
(:meth:`~.base.Runtime.cuda_missing`: copying every call's tensors to host memory and back
is slower than PyTorch on the GPU; with none left the graph stays in PyTorch, with one
warning). What remains are the candidates, best first. Where several CPU runtimes with a
:attr:`~.base.Runtime.cpu_target` remain (OpenVINO and ONNX Runtime for the ``tensorrt`` target
on a machine without a GPU) a float graph is timed on each and the faster one runs
(:mod:`embedl_dynamo.tuning.runtime_choice`). A forced runtime that cannot run raises
:class:`~embedl_dynamo.errors.RuntimeUnavailableError` naming what is missing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedl_dynamo.backend import Backend
from embedl_dynamo.errors import RuntimeUnavailableError
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime
from embedl_dynamo.settings import ENV_RUNTIME, Settings

if TYPE_CHECKING:
    import onnx

__all__ = [
    "AUTO",
    "BUILTIN_RUNTIMES",
    "ENTRY_POINT_GROUP",
    "auto_order",
    "check_runtime",
    "register_runtime",
    "reset_runtimes",
    "runtime_candidates",
    "runtime_classes",
    "runtime_for_file",
    "runtime_lint",
    "runtime_names",
    "runtime_settings",
]

logger = logging.getLogger(__name__)

AUTO = "auto"
ENTRY_POINT_GROUP = "embedl_dynamo.runtimes"
#: the runtimes this package ships, in the order error messages list them
BUILTIN_RUNTIMES: tuple[type[Runtime], ...] = (
    OnnxRuntime,
    OpenVINORuntime,
    TensorRTRuntime,
    TorchTensorRTRuntime,
    EagerRuntime,
)


@dataclass
class _Registry:
    classes: dict[str, type[Runtime]] | None = None
    origins: dict[str, str] = field(default_factory=dict)
    logged_auto: set[str] = field(default_factory=set)


_registry = _Registry()


def _add(found: dict[str, type[Runtime]], origins: dict[str, str], cls: Any, origin: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Runtime)) or not cls.name:
        raise TypeError(f"{origin} is not a Runtime subclass with a name: {cls!r}")
    if cls.name == AUTO:
        raise ValueError(f"{origin}: the runtime name {AUTO!r} is reserved; choose another name")
    if cls.name in found:
        if found[cls.name] is cls:
            return  # the same class seen twice (one distribution twice on sys.path)
        raise RuntimeError(
            f"runtime name {cls.name!r} is registered twice: by {origins[cls.name]} and by "
            f"{origin}. Uninstall or rename one of them."
        )
    found[cls.name] = cls
    origins[cls.name] = origin


def _discover() -> dict[str, type[Runtime]]:
    """The built-ins, then the entry-point group's runtimes (cached until :func:`reset_runtimes`)."""
    if _registry.classes is None:
        found: dict[str, type[Runtime]] = {}
        origins: dict[str, str] = {}
        for cls in BUILTIN_RUNTIMES:
            _add(found, origins, cls, f"{cls.__module__}.{cls.__qualname__} (built in)")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            origin = f"{ep.value} (from {ep.dist.name if ep.dist else 'an unknown distribution'})"
            try:
                cls = ep.load()
            except Exception as exc:  # a broken plug-in must not hide the others
                logger.warning(
                    "could not load runtime entry point %s = %s: %s", ep.name, ep.value, exc
                )
                continue
            if callable(cls) and not isinstance(cls, type):
                cls = cls()
            _add(found, origins, cls, origin)
        _registry.classes, _registry.origins = found, origins
        logger.debug("runtimes: %s", ", ".join(found))
    return _registry.classes


def runtime_classes() -> dict[str, type[Runtime]]:
    """Every registered runtime class by name: built-ins, entry points, then registered ones."""
    return dict(_discover())


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    """Add a runtime class to the registry (usable as a class decorator).

    Raises:
        RuntimeError: another class already has its name.
        TypeError: ``cls`` is not a named :class:`~.base.Runtime` subclass.
    """
    classes = _discover()
    _add(classes, _registry.origins, cls, f"{cls.__module__}.{cls.__qualname__} (registered)")
    return cls


def reset_runtimes() -> None:
    """Forget registered and discovered runtimes (the next look-up discovers them again)."""
    _registry.classes = None
    _registry.origins = {}
    _registry.logged_auto = set()


def runtime_names() -> tuple[str, ...]:
    """The values ``runtime=`` takes: ``auto`` and every registered runtime's name."""
    return (AUTO, *_discover())


def check_runtime(name: str, source: str = "runtime") -> None:
    """Raise ``ValueError`` listing the valid runtime names if ``name`` is not one.

    Args:
        name: the runtime name given.
        source: where it came from (``runtime`` for the option, or the environment variable).
    """
    valid = runtime_names()
    if name not in valid:
        listed = ", ".join(valid) if source == ENV_RUNTIME else ", ".join(map(repr, valid))
        raise ValueError(f"invalid {source}={name!r}; valid values: {listed}")


def runtime_settings(
    options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """:meth:`Settings.from_options <embedl_dynamo.settings.Settings.from_options>` with the
    runtime name checked against the registry (the error names the option or the variable).

    Raises:
        ValueError: an unknown option, an invalid value, or an unknown runtime name.
    """
    settings = Settings.from_options(options, env)
    given = "runtime" in (options or {})
    env = os.environ if env is None else env
    check_runtime(settings.runtime, "runtime" if given or not env.get(ENV_RUNTIME) else ENV_RUNTIME)
    return settings


def auto_order() -> list[str]:
    """What ``auto`` tries for a target that names no runtimes: highest ``auto_rank`` first."""
    classes = _discover()
    return sorted(classes, key=lambda name: -classes[name].auto_rank)


def _order(backend: Backend | None) -> list[str]:
    named = list(backend.runtimes) if backend is not None else []
    classes = _discover()
    unknown = [name for name in named if name not in classes]
    if unknown:
        raise ValueError(
            f"Backend {backend.name!r}: unknown runtimes {unknown}; valid: {', '.join(classes)}"
        )
    return named or auto_order()


def runtime_candidates(
    name: str, backend: Backend | None = None, on_cuda: bool = False
) -> list[type[Runtime]]:
    """The runtimes that may run a graph, best first (see the module docstring).

    Args:
        name: a runtime name or ``auto``.
        backend: the target (its ``runtimes`` narrow ``auto``); None: every runtime.
        on_cuda: the graph's tensors are on a CUDA device.

    Returns:
        ``[the forced runtime]``, or for ``auto`` the available candidates (``[EagerRuntime]``
        when none of the target's runtimes is installed).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        RuntimeUnavailableError: a forced runtime cannot run here.
    """
    check_runtime(name)
    classes = _discover()
    if name != AUTO:
        classes[name].require()
        if on_cuda and classes[name].cuda_missing() is not None:
            raise RuntimeUnavailableError(
                f"runtime {name!r} cannot run a graph on a CUDA device: "
                f"{classes[name].cuda_missing()}. Move the model and its inputs to the CPU, "
                "or leave runtime='auto' (the graph then runs where its tensors are)"
            )
        return [classes[name]]
    order = _order(backend)
    found = []
    for candidate in order:
        cls = classes[candidate]
        if cls.cuda_only and not on_cuda:
            continue
        missing = cls.missing() or (cls.cuda_missing() if on_cuda else None)
        if missing is None:
            found.append(cls)
        else:
            logger.debug("runtime %s skipped by 'auto': %s", candidate, missing)
    if not found:
        where = "runs on a CUDA device" if on_cuda else "is installed"
        target = backend.name if backend is not None else ""
        key = f"none:{','.join(order)}:{where}:{target}"
        log = logger.debug if key in _registry.logged_auto else logger.warning  # once a process
        _registry.logged_auto.add(key)
        log(
            "runtime 'auto': none of %s %s for target %r; its graphs stay in PyTorch%s",
            ", ".join(order),
            where,
            target,
            " (CUDA tensors need tensorrt, or onnxruntime-gpu for ONNX Runtime)" if on_cuda else "",
        )
        return [EagerRuntime]
    key = ",".join(c.name for c in found)
    if key not in _registry.logged_auto:
        _registry.logged_auto.add(key)
        logger.info("runtime 'auto' selected %s", " or ".join(c.name for c in found))
    return found


def runtime_for_file(path: Path) -> type[Runtime]:
    """The runtime class that loads an artifact with ``path``'s suffix by default: the first
    registered that takes it (``onnxruntime`` for ``.onnx``, which ``openvino`` loads too).

    Raises:
        ValueError: no runtime takes that suffix (the message lists the known ones).
    """
    suffix = Path(path).suffix.lower()
    classes = _discover().values()
    for cls in classes:
        if suffix in cls.artifact_suffixes:
            return cls
    takers: dict[str, list[str]] = {}
    for cls in classes:
        for known_suffix in cls.artifact_suffixes:
            takers.setdefault(known_suffix, []).append(cls.name)
    known = [f"{s} ({', '.join(names)})" for s, names in takers.items()]
    raise ValueError(
        f"cannot load {Path(path).name}: expected .onnx or a TensorRT engine; known suffixes: "
        f"{', '.join(known)}"
    )


def runtime_lint(backend: Backend, model: onnx.ModelProto) -> list[str] | None:
    """The problems the lints of the runtimes ``backend`` names find in ``model``.

    Returns:
        One line per problem (``[]``: it passes), or None when none of them has a lint.
    """
    if not backend.runtimes:
        return None
    classes = _discover()
    results = [classes[name].lint(model) for name in _order(backend)]
    found = [r for r in results if r is not None]
    return [line for r in found for line in r] if found else None
