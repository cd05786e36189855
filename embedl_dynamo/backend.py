"""Backends (hardware targets): the pattern lists per pipeline phase, and their registry.

A :class:`Backend` is a frozen dataclass naming a target and the patterns each phase uses.
Backends are found through the ``embedl_dynamo.backends`` entry-point group; the built-in
``tensorrt``, ``onnxruntime``, ``openvino`` and ``lattice`` are registered there by our own
``pyproject.toml``, so a vendor's package adds a target exactly the way we do::

    [project.entry-points."embedl_dynamo.backends"]
    myaccel = "myaccel_embedl:BACKEND"

The active backend is, in order: the one chosen with :func:`set_backend`, the one named by the
``EMBEDL_DYNAMO_BACKEND`` environment variable, or the only one installed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from embedl_dynamo.quant.int8.quantizer import Quantizer
from embedl_dynamo.quant.int8.rules import PlacementRule, PreparationRewrite
from embedl_dynamo.quant.int8.smooth import SmoothingRule
from embedl_dynamo.quant.int8.spec import QuantizationConfig
from embedl_dynamo.rewrite.pattern import PHASES, Pattern

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "Backend",
    "as_backend",
    "backend_by_name",
    "discover_backends",
    "get_backend",
    "reset_backends",
    "set_backend",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "embedl_dynamo.backends"
ENV_VAR = "EMBEDL_DYNAMO_BACKEND"

_FIELDS = {
    "conversion": "conversion_patterns",
    "fusion": "fusion_patterns",
    "smooth": "smooth_patterns",
    "quantized": "quantized_patterns",
}
# the protocol each phase's list holds (its own small protocol per phase)
_PROTOCOLS: dict[str, tuple[type, ...]] = {
    "conversion": (Pattern,),
    "fusion": (Pattern,),
    "smooth": (SmoothingRule,),
    "quantized": (PlacementRule, PreparationRewrite),
}


@dataclass(frozen=True)
class Backend:
    """A hardware target and the patterns each pipeline phase uses for it.

    Attributes:
        name: the target's name (``tensorrt``); the dynamo backend is ``embedl_<name>``.
        conversion_patterns: structural rewrites, run to a fixpoint.
        fusion_patterns: operator fusions, matched longest first.
        smooth_patterns: SmoothQuant-style scale migrations run before quantization
            (`embedl_dynamo.quant.int8.smooth.SmoothingRule`).
        quantized_patterns: QDQ placement rules and preparation rewrites
            (`embedl_dynamo.quant.int8.rules`).
        quantization: the target's quantization config (dtype, symmetry, granularity per
            role; see `embedl_dynamo.quant`), or None when the target has no INT8 path.
        runtimes: the runtimes the target's artifacts are meant for, best first: ``auto``
            picks the first available one (CUDA-only runtimes only for a graph on a CUDA
            device; where several CPU runtimes remain, float graphs are timed on each). Empty:
            every registered runtime (`embedl_dynamo.runtimes.registry.auto_order`).
            The runtime registry checks the names when it resolves them.
        description: one line for ``embedl-dynamo backends``.

    Example:
        >>> import embedl_dynamo
        >>> embedl_dynamo.discover_backends()["onnxruntime"].name
        'onnxruntime'
    """

    name: str
    conversion_patterns: Sequence[Pattern] = ()
    fusion_patterns: Sequence[Pattern] = ()
    smooth_patterns: Sequence[SmoothingRule] = ()
    quantized_patterns: Sequence[PlacementRule | PreparationRewrite] = ()
    quantization: QuantizationConfig | None = None
    runtimes: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"Backend name must be a non-empty identifier, got {self.name!r}")
        for phase, attr in _FIELDS.items():
            patterns = tuple(getattr(self, attr))
            for pattern in patterns:
                if not isinstance(pattern, _PROTOCOLS[phase]):
                    kinds = " or ".join(t.__name__ for t in _PROTOCOLS[phase])
                    raise TypeError(
                        f"Backend {self.name!r}: {attr} holds {pattern!r}, which is not a "
                        f"{kinds} instance (did you pass the class instead of an instance?)"
                    )
                if pattern.phase != phase:
                    raise ValueError(
                        f"Backend {self.name!r}: pattern {pattern.name!r} has phase "
                        f"{pattern.phase!r} but is listed in {attr} (phase {phase!r})"
                    )
            names = [p.name for p in patterns]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"Backend {self.name!r}: {attr} repeats {duplicates}")
            object.__setattr__(self, attr, patterns)
        runtimes = tuple(self.runtimes)
        if not all(isinstance(r, str) and r for r in runtimes):
            raise TypeError(f"Backend {self.name!r}: runtimes must be names, got {runtimes!r}")
        object.__setattr__(self, "runtimes", runtimes)
        if self.quantization is not None and not isinstance(self.quantization, QuantizationConfig):
            raise TypeError(
                f"Backend {self.name!r}: quantization must be a QuantizationConfig or None, got "
                f"{type(self.quantization).__name__}"
            )

    @property
    def quantizer(self) -> Quantizer:
        """This target's `embedl_dynamo.quant.int8.quantizer.Quantizer`.

        Raises:
            ValueError: the target has no INT8 configuration (the message lists those that do).
        """
        if self.quantization is None:
            with_int8 = sorted(n for n, b in discover_backends().items() if b.quantization)
            raise ValueError(
                f"backend {self.name!r} has no INT8 quantization config; use one of: {with_int8}"
            )
        return Quantizer(
            self.name, self.quantization, self.quantized_patterns, self.smooth_patterns
        )

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        """Every pattern of every phase, in pipeline order."""
        return tuple(p for phase in PHASES for p in getattr(self, _FIELDS[phase]))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: pattern names per phase, and the quantization config."""
        data: dict[str, Any] = {"name": self.name, "description": self.description}
        for attr in _FIELDS.values():
            data[attr] = [p.name for p in getattr(self, attr)]
        data["quantization"] = self.quantization.to_dict() if self.quantization else None
        data["runtimes"] = list(self.runtimes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], catalogue: Sequence[Pattern] | None = None) -> Backend:
        """Rebuild a Backend from [to_dict][embedl_dynamo.Backend.to_dict] output, resolving
        pattern names.

        Args:
            data: the dictionary.
            catalogue: patterns to resolve names against; every discovered backend's patterns
                when None.
        """
        if catalogue is None:
            catalogue = [p for b in discover_backends().values() for p in b.patterns]
        by_name: dict[tuple[str, str], Pattern] = {(p.phase, p.name): p for p in catalogue}
        kwargs: dict[str, Any] = {"name": data["name"], "description": data.get("description", "")}
        for phase, attr in _FIELDS.items():
            resolved = []
            for name in data.get(attr, ()):
                if (phase, name) not in by_name:
                    known = sorted(n for (ph, n) in by_name if ph == phase)
                    raise ValueError(f"unknown {phase} pattern {name!r}; known: {known}")
                resolved.append(by_name[(phase, name)])
            kwargs[attr] = tuple(resolved)
        if data.get("quantization") is not None:
            kwargs["quantization"] = QuantizationConfig.from_dict(data["quantization"])
        kwargs["runtimes"] = tuple(data.get("runtimes", ()))
        return cls(**kwargs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{attr}={len(getattr(self, attr))}" for attr in _FIELDS.values())
        return f"Backend({self.name!r}, {counts})"


@dataclass
class _Registry:
    backends: dict[str, Backend] | None = None
    selected: str | None = None
    origins: dict[str, str] = field(default_factory=dict)


_registry = _Registry()


def discover_backends() -> dict[str, Backend]:
    """All Backends registered in the ``embedl_dynamo.backends`` entry-point group, by name.

    Cached after the first call (see [reset_backends][embedl_dynamo.reset_backends]). A name
    registered twice is refused.

    Example:
        >>> import embedl_dynamo
        >>> {"onnxruntime", "openvino", "tensorrt"} <= set(embedl_dynamo.discover_backends())
        True
    """
    if _registry.backends is not None:
        return dict(_registry.backends)
    found: dict[str, Backend] = {}
    origins: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"{ep.value} (from {ep.dist.name if ep.dist else 'an unknown distribution'})"
        try:
            backend = ep.load()
        except Exception as exc:  # a broken plug-in must not hide the others
            logger.warning("could not load backend entry point %s = %s: %s", ep.name, ep.value, exc)
            continue
        if callable(backend) and not isinstance(backend, Backend):
            backend = backend()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a Backend: {backend!r}")
        if backend.name in found:
            if origins[backend.name] == origin:
                continue  # the same distribution seen twice on sys.path
            raise RuntimeError(
                f"backend name {backend.name!r} is registered twice: by {origins[backend.name]} "
                f"and by {origin}. Uninstall one of them."
            )
        found[backend.name] = backend
        origins[backend.name] = origin
    _registry.backends = found
    _registry.origins = origins
    logger.debug("discovered backends: %s", sorted(found))
    return dict(found)


def _unknown(name: str, known: Sequence[str]) -> ValueError:
    listed = ", ".join(sorted(known)) or "none installed"
    return ValueError(f"unknown backend {name!r}; known backends: {listed}")


def backend_by_name(name: str) -> Backend:
    """The discovered Backend called ``name``; ``ValueError`` listing the known ones if none."""
    backends = discover_backends()
    if name not in backends:
        raise _unknown(name, list(backends))
    return backends[name]


def as_backend(backend: Backend | str | None) -> Backend:
    """A Backend from an instance, a name, or None (the active one, :func:`get_backend`)."""
    if backend is None:
        return get_backend()
    if isinstance(backend, str):
        return backend_by_name(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"expected a Backend or a backend name, got {backend!r}")
    return backend


def set_backend(name: str | None) -> Backend | None:
    """Select the active backend by name (None clears the choice).

    Example:
        ```python
        embedl_dynamo.set_backend("openvino")  # transform() without patterns uses its patterns
        plan = embedl_dynamo.get_transformation_plan(model, (x,))
        ```
    """
    if name is None:
        _registry.selected = None
        return None
    backend = backend_by_name(name)
    _registry.selected = name
    return backend


def get_backend() -> Backend:
    """The active Backend: the explicit choice, then ``$EMBEDL_DYNAMO_BACKEND``, then the only one.

    Raises:
        ValueError: the chosen or environment-named backend does not exist.
        RuntimeError: no choice was made and zero or several backends are installed.

    Example:
        >>> import embedl_dynamo
        >>> embedl_dynamo.set_backend("onnxruntime").name
        'onnxruntime'
        >>> embedl_dynamo.get_backend().name
        'onnxruntime'
        >>> embedl_dynamo.set_backend(None)  # no choice again
    """
    if _registry.selected is not None:
        return backend_by_name(_registry.selected)
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        backends = discover_backends()
        if from_env not in backends:
            raise ValueError(
                f"{ENV_VAR}={from_env!r} names no installed backend; known backends: "
                f"{', '.join(sorted(backends)) or 'none installed'}"
            )
        return backends[from_env]
    backends = discover_backends()
    if len(backends) == 1:
        return next(iter(backends.values()))
    if not backends:
        raise RuntimeError(
            "no embedl_dynamo backend is installed: install embedl-dynamo (which registers "
            f"'tensorrt', 'onnxruntime', 'openvino' and 'lattice') or a package in the "
            f"{ENTRY_POINT_GROUP!r} "
            "entry-point group"
        )
    raise RuntimeError(
        f"several backends are installed ({', '.join(sorted(backends))}) and none is selected: "
        f"call embedl_dynamo.set_backend(name), set {ENV_VAR}=name, or use the dynamo backend "
        "'embedl_<name>'"
    )


def reset_backends() -> None:
    """Forget discovered backends and the selection (tests use this to isolate state).

    Example:
        ```python
        embedl_dynamo.reset_backends()  # after installing a package with new backends
        backends = embedl_dynamo.discover_backends()  # read the entry points again
        ```
    """
    _registry.backends = None
    _registry.selected = None
    _registry.origins = {}
