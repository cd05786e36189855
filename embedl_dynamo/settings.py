"""Typed, immutable settings of the ``embedl_*`` dynamo backends.

Each value comes from, in order: ``torch.compile(..., options={...})``, then an environment
variable (``EMBEDL_DYNAMO_RUNTIME``, ``EMBEDL_DYNAMO_PRECISION``, ``EMBEDL_DYNAMO_CACHE_DIR``),
then the default. Unknown keys
and bad values raise ``ValueError`` listing what is valid; a removed option says why it went. The
runtime name is checked by the runtime registry, which sits above the settings and knows every
runtime (:func:`embedl_dynamo.runtimes.registry.runtime_settings`). :class:`Settings` is a frozen
dataclass: derive a changed copy with :func:`dataclasses.replace`, never mutate.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.budget import max_cache_bytes
from embedl_dynamo.cache.files import (
    ENV_CACHE_DIR,
    ENV_CACHE_READ_ONLY,
    default_cache_dir,
    env_flag,
    lock_timeout,
)
from embedl_dynamo.cache.tags import cache_key
from embedl_dynamo.precision import Precision, get_precision, precision_names

__all__ = [
    "ENV_PRECISION",
    "ENV_RUNTIME",
    "FALLBACKS",
    "OBSERVERS",
    "Settings",
]

ENV_RUNTIME = "EMBEDL_DYNAMO_RUNTIME"
ENV_PRECISION = "EMBEDL_DYNAMO_PRECISION"

FALLBACKS = ("eager", "raise")
# ``quantize="int8"``: the older spelling of ``precision="int8"``, accepted as an option only
_QUANTIZE_ALIAS = "quantize"
OBSERVERS = ("minmax", "mean_minmax", "percentile", "mse", "entropy")

# options that are never part of a cache key (data, or purely cosmetic)
_READ_ONCE: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_NOT_KEYED = ("calibration_data", "progress", "cache_dir")
# options that existed once: name -> why it went and what to do instead
_REMOVED = {
    "transformer_fusion": (
        "ONNX Runtime's transformer optimizer pass was removed: it was not faster on BERT-class "
        "models and added compile time. Delete the option"
    ),
}


def _choice(name: str, value: Any, valid: tuple[Any, ...]) -> None:
    if value not in valid:
        raise ValueError(f"invalid {name}={value!r}; valid values: {', '.join(map(repr, valid))}")


def _int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"invalid {name}={value!r}; expected an integer >= {minimum}")


def _bool(name: str, value: Any, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        expected = "True, False or None" if optional else "True or False"
        raise ValueError(f"invalid {name}={value!r}; expected {expected}")


def _alias_precision(quantize: Any, precision: str | Precision) -> str | Precision:
    """The precision that ``quantize=`` (the older spelling of ``precision="int8"``) asks for."""
    _choice("quantize", quantize, (None, "int8"))
    if quantize is None:
        return precision
    asked = get_precision(precision)
    if asked.quantizes:  # int8 or mixed: already quantizes
        return asked
    if asked.lower:
        raise ValueError(
            f"quantize='int8' conflicts with precision={asked.name!r}; give one: "
            "precision='int8' (every layer the target quantizes) or 'mixed' (INT8 where "
            "it pays, the rest float)"
        )
    return "int8"


@dataclass(frozen=True)
class Settings:
    """Settings of one ``torch.compile`` call.

    Attributes:
        runtime: ``auto`` (best available) or a registered runtime's name (``onnxruntime``,
            ``openvino``, ``tensorrt``, ``torch_tensorrt``, ``eager``...); the runtime registry
            checks it (:func:`embedl_dynamo.runtimes.registry.check_runtime`).
        cache_dir: the artifact cache root.
        fallback: ``eager`` runs a subgraph the runtime cannot take in PyTorch (and reports
            why); ``raise`` raises.
        min_subgraph_size: subgraphs with fewer operations stay in PyTorch.
        dynamic_batch: export with a dynamic batch axis so a new batch size does not rebuild.
        num_threads: ONNX Runtime intra-op threads (PyTorch's ``torch.get_num_threads()``
            when None).
        precision: a registered :class:`~embedl_dynamo.precision.Precision`, given by name:
            ``fp32`` (default); ``fp16``/``bf16`` (compute in half precision, with
            reductions, normalisation statistics, softmax and the outputs kept in fp32);
            ``int8`` (every layer the target quantizes); ``mixed`` (INT8 per layer where it is
            faster and the output stays within ``accuracy_budget``, the rest fp32). The option
            ``quantize="int8"`` is the older spelling of ``precision="int8"``.
            ``int8_weight_only`` / ``int4_weight_only``: the linear layers' weights stored as
            integers (per output channel / per group), activations float, no calibration.
        calibration_data: iterable of input tensors / tuples, or a callable
            ``forward_loop(model)``; None calibrates on the first real calls.
        calibration_steps: how many batches calibration uses.
        observer: the activations' range estimator: ``minmax``, ``mean_minmax`` (the mean of
            each batch's min and max, NNCF's), ``percentile``, ``mse`` or ``entropy``; None:
            the target's own (``mean_minmax`` for ``openvino``, ``minmax`` for the others).
        calibration_cache: keep calibrated ranges in the cache directory.
        accuracy_budget: the least cosine similarity a lower-precision artifact's outputs must
            have to the float model's on the build sample; below it the float artifact runs.
        max_batch: the largest batch a TensorRT engine's profile takes (None: 32, or the
            example's batch if larger).
        max_seq: the largest size of any other dynamic axis (sequence length, image side) in a
            TensorRT engine's profile (None: 512, or the example's size if larger).
        progress: show progress bars (None: only when stderr is a terminal).
        weight_only_group_size: input features per scale of ``int4_weight_only`` weights: a
            power of two from 16 to 256 (NNCF's and torchao's default: 128).
        weight_only_symmetric: weight-only zero points all 0; None: symmetric for the
            TensorRT target (its quantization is symmetric), asymmetric elsewhere (NNCF's
            and optimum-intel's default).
        beat_eager: under ``runtime="auto"``, an ``fp32`` or ``mixed`` subgraph on the CPU
            runs in PyTorch unless the runtime chosen for it is timed faster than PyTorch
            itself by the speed margin (:mod:`embedl_dynamo.tuning.beat_eager`); False keeps
            the runtime without timing PyTorch.
    """

    runtime: str = "auto"
    cache_dir: Path = field(default_factory=default_cache_dir)
    fallback: str = "eager"
    min_subgraph_size: int = 3
    dynamic_batch: bool = True
    num_threads: int | None = None
    precision: Precision = "fp32"  # type: ignore[assignment]  # a name, looked up on init
    calibration_data: Any = field(default=None, compare=False, repr=False)
    calibration_steps: int = 32
    observer: str | None = None
    calibration_cache: bool = True
    accuracy_budget: float = 0.99
    max_batch: int | None = None
    max_seq: int | None = None
    progress: bool | None = None
    weight_only_group_size: int = 128
    weight_only_symmetric: bool | None = None
    beat_eager: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.runtime, str) or not self.runtime:
            raise ValueError(f"invalid runtime={self.runtime!r}; expected a runtime name")
        _choice("fallback", self.fallback, FALLBACKS)
        object.__setattr__(self, "precision", get_precision(self.precision))
        _choice("observer", self.observer, (None, *OBSERVERS))
        _int("min_subgraph_size", self.min_subgraph_size, 0)
        _int("calibration_steps", self.calibration_steps, 1)
        if self.num_threads is not None:
            _int("num_threads", self.num_threads, 1)
        for name in ("max_batch", "max_seq"):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), 1)
        _bool("dynamic_batch", self.dynamic_batch)
        _bool("calibration_cache", self.calibration_cache)
        _bool("beat_eager", self.beat_eager)
        budget = self.accuracy_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
            raise ValueError(
                f"invalid accuracy_budget={budget!r}; expected a cosine similarity in (0, 1], "
                "e.g. 0.99"
            )
        _bool("progress", self.progress, optional=True)
        _bool("weight_only_symmetric", self.weight_only_symmetric, optional=True)
        group = self.weight_only_group_size
        if (
            isinstance(group, bool)
            or not isinstance(group, int)
            or not 16 <= group <= 256
            or (group & (group - 1))
        ):
            raise ValueError(
                f"invalid weight_only_group_size={group!r}; expected a power of two from 16 "
                "to 256, e.g. 128"
            )
        if not isinstance(self.cache_dir, (str, os.PathLike)) or not str(self.cache_dir):
            raise ValueError(f"invalid cache_dir={self.cache_dir!r}; expected a directory path")
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        data = self.calibration_data
        if data is not None and not callable(data) and not hasattr(data, "__iter__"):
            raise ValueError(
                f"invalid calibration_data of type {type(data).__name__}; expected an iterable "
                "of input tensors/tuples or a callable forward_loop(model)"
            )
        if data is not None and not callable(data) and iter(data) is data:
            # a one-shot iterator (a generator): read it once, so every subgraph, recompile and
            # later compile given the same object calibrates on the same batches
            try:
                batches = _READ_ONCE.get(data)
                if batches is None:
                    batches = _READ_ONCE[data] = list(data)
            except TypeError:  # not weak-referenceable: read it for this use only
                batches = list(data)
            object.__setattr__(self, "calibration_data", batches)

    def float_copy(self) -> Settings:
        """These settings at ``precision="fp32"`` (the float build an INT8 one is judged by)."""
        return dataclasses.replace(self, precision="fp32")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every valid option name (the fields, and the ``quantize`` alias)."""
        return (*(f.name for f in dataclasses.fields(cls)), _QUANTIZE_ALIAS)

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Build settings from ``torch.compile`` options, then the environment, then defaults.

        Args:
            options: the ``options`` dict given to ``torch.compile`` (None: none).
            env: the environment to read (``os.environ`` when None).

        Raises:
            ValueError: an unknown option name or an invalid value; the message lists the
                valid names or values (:class:`~embedl_dynamo.errors.ConfigurationError` for
                the cache's variables: ``EMBEDL_DYNAMO_CACHE_MAX_SIZE``, ``..._LOCK_TIMEOUT``,
                ``..._READ_ONLY`` and ``..._KEY_FILE``).
        """
        options = dict(options or {})
        env = os.environ if env is None else env
        removed = sorted(set(options) & set(_REMOVED))
        if removed:
            raise ValueError(f"option {removed[0]!r} no longer exists: {_REMOVED[removed[0]]}")
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ValueError(
                f"unknown embedl_dynamo option(s) {unknown}; valid options: "
                f"{', '.join(cls.names())}"
            )
        kwargs: dict[str, Any] = {}
        if env.get(ENV_RUNTIME):  # the runtime registry checks the name
            kwargs["runtime"] = env[ENV_RUNTIME]
        if env.get(ENV_PRECISION) and not {"precision", _QUANTIZE_ALIAS} & set(options):
            precision = env[ENV_PRECISION]
            if precision not in precision_names():
                raise ValueError(
                    f"invalid {ENV_PRECISION}={precision!r}; valid values: "
                    f"{', '.join(precision_names())}"
                )
            kwargs["precision"] = precision
        if env.get(ENV_CACHE_DIR):
            kwargs["cache_dir"] = Path(env[ENV_CACHE_DIR])
        max_cache_bytes(env)  # the cache's variables, checked here: a bad value is an error
        lock_timeout(env)  # now, not a failed cache write that sends the model to PyTorch
        env_flag(ENV_CACHE_READ_ONLY, env)
        cache_key(env)
        if _QUANTIZE_ALIAS in options:
            options["precision"] = _alias_precision(
                options.pop(_QUANTIZE_ALIAS), options.get("precision", "fp32")
            )
        kwargs.update(options)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the settings, without the calibration data (for cache keys)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "calibration_data":
                data[f.name] = None if value is None else type(value).__name__
            elif isinstance(value, Precision):
                data[f.name] = value.name  # the same string as before the registry: keys hold
            elif isinstance(value, Path):
                data[f.name] = str(value)
            else:
                data[f.name] = value
        return data

    def key_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` less the fields that do not change built artifacts."""
        data = self.to_dict()
        for name in _NOT_KEYED:
            data.pop(name, None)
        return data
