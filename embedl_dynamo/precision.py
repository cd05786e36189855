"""The precisions a graph can be built at: one typed registry, one entry per precision.

A :class:`Precision` carries the facts the rest of the package asks about (whether it is a
lower precision judged by ``accuracy_budget``, whether it calibrates and inserts Q/DQ, whether
it is chosen per layer by measuring, its half dtype), its *stage*: what the pipeline does to
the float graph for it (cast to half, calibrate and insert Q/DQ, or nothing), and its *form*:
what is then chosen by measuring on the runtime (``mixed``'s layers, a half precision's typed
or hinted graph on OpenVINO; :func:`~embedl_dynamo.tuning.precision_form.transform_for` runs
both). A stage or form is named like an entry point (``"module:function"``) so this low layer
names it without importing the layers above, or given as the callable itself.

Adding a precision is its stage module plus one :func:`register_precision` line; settings,
options, ``EMBEDL_DYNAMO_PRECISION``, ``export()`` and the CLI then accept its name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Precision",
    "PrecisionForm",
    "PrecisionStage",
    "get_precision",
    "precision_names",
    "register_precision",
    "unregister_precision",
]

# (float graph, example inputs, backend, settings) -> (graph at this precision, report entries)
PrecisionStage = Callable[[Any, Sequence[Any], Any, Any], tuple[Any, dict[str, Any]]]
# (pipeline result, FormContext) -> the pipeline result in the form chosen
PrecisionForm = Callable[[Any, Any], Any]

_MIXED_FORM = "embedl_dynamo.tuning.mixed_precision:apply_mixed_form"
_HALF_FORM = "embedl_dynamo.tuning.half_form:apply_half_form"


@dataclass(frozen=True)
class Precision:
    """One precision and what the pipeline does for it.

    Attributes:
        name: the option value (``precision="int8"``), unique in the registry.
        lower: a lower precision than fp32, judged against the float model by
            ``accuracy_budget`` (the float artifact runs when it falls short).
        calibrates: needs calibration data (or calibrates on the first real calls).
        quantizes: inserts Q/DQ (fake-quant) nodes.
        qdq_type: the type its Q/DQ nodes quantize to (``"int8"``, ``"float8e4m3fn"``); the
            int8-only paths (first-call calibration, the CPU runtimes' INT8 placement,
            Torch-TensorRT's INT8 op) ask it. Set exactly when ``quantizes``; ``"int8"`` when
            not given.
        per_layer: decided layer by layer by measuring (``mixed``), after the pipeline.
        half_dtype: the half type the graph computes in (``fp16``/``bf16``), else None.
        stage: what the pipeline runs on the float graph, a :data:`PrecisionStage` or its
            ``"module:function"`` name; None: the float graph as it is.
        form: what runs on the pipeline's result to choose its form by measuring on the
            runtime, a :data:`PrecisionForm` or its name; when not given, ``mixed``'s per-layer
            choice for a ``per_layer`` precision, the half form for one with ``half_dtype``,
            else none.
    """

    name: str
    lower: bool = True
    calibrates: bool = False
    quantizes: bool = False
    qdq_type: str | None = None
    per_layer: bool = False
    half_dtype: torch.dtype | None = None
    stage: str | PrecisionStage | None = None
    form: str | PrecisionForm | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"invalid precision name {self.name!r}; expected an identifier such as 'fp8'"
            )
        for flag in ("lower", "calibrates", "quantizes", "per_layer"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"Precision {self.name!r}: {flag} must be True or False")
        if self.quantizes and self.qdq_type is None:
            object.__setattr__(self, "qdq_type", "int8")
        if not self.quantizes and self.qdq_type is not None:
            raise ValueError(
                f"Precision {self.name!r}: qdq_type={self.qdq_type!r} without quantizes=True"
            )
        if self.half_dtype is not None and not (
            isinstance(self.half_dtype, torch.dtype) and self.half_dtype.is_floating_point
        ):
            raise ValueError(
                f"Precision {self.name!r}: half_dtype={self.half_dtype!r} is not a floating "
                "torch.dtype; give e.g. torch.float16, or None"
            )
        for step in ("stage", "form"):
            value = getattr(self, step)
            if isinstance(value, str) and value.count(":") != 1:
                raise ValueError(
                    f"Precision {self.name!r}: {step}={value!r} is not 'module:function'; give "
                    "that or the callable"
                )
            if value is not None and not isinstance(value, str) and not callable(value):
                raise ValueError(
                    f"Precision {self.name!r}: {step} must be callable, a name or None"
                )
        if self.form is None and self.per_layer:
            object.__setattr__(self, "form", _MIXED_FORM)
        elif self.form is None and self.half_dtype is not None:
            object.__setattr__(self, "form", _HALF_FORM)

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            raise TypeError(
                f"a Precision is not compared with the string {other!r}: ask its facts "
                "(.lower, .quantizes, .per_layer, ...) or compare .name"
            )
        if not isinstance(other, Precision):
            return NotImplemented
        return _fields(self) == _fields(other)

    def __hash__(self) -> int:
        return hash(_fields(self))

    def load_stage(self) -> PrecisionStage | None:
        """The stage as a callable (a ``"module:function"`` name is imported on first use).

        Raises:
            ValueError: the named stage cannot be imported.
        """
        return _load_step(self.name, "stage", self.stage)

    def load_form(self) -> PrecisionForm | None:
        """The form as a callable (a ``"module:function"`` name is imported on first use).

        Raises:
            ValueError: the named form cannot be imported.
        """
        return _load_step(self.name, "form", self.form)


def _load_step(precision: str, step: str, value: str | Callable[..., Any] | None) -> Any:
    """``value`` (a precision's stage or form) as a callable, importing a named one."""
    if not isinstance(value, str):
        return value
    module, _, function = value.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"precision {precision!r}: its {step} {value!r} cannot be loaded ({exc}); "
            "register it with an importable 'module:function' or the callable"
        ) from exc


def _fields(p: Precision) -> tuple[Any, ...]:
    return (
        p.name,
        p.lower,
        p.calibrates,
        p.quantizes,
        p.qdq_type,
        p.per_layer,
        p.half_dtype,
        p.stage,
        p.form,
    )


_HALF = "embedl_dynamo.quant.half.stage:half_stage"
_INT8 = "embedl_dynamo.quant.int8.stage:int8_stage"
_WEIGHT_ONLY = "embedl_dynamo.quant.weight_only.stage:weight_only_stage"
_FP8 = "embedl_dynamo.quant.fp8.stage:fp8_stage"
_BUILT_IN = (
    Precision("fp32", lower=False),
    Precision("fp16", half_dtype=torch.float16, stage=_HALF),
    Precision("bf16", half_dtype=torch.bfloat16, stage=_HALF),
    Precision("int8", calibrates=True, quantizes=True, stage=_INT8),
    Precision("mixed", calibrates=True, quantizes=True, per_layer=True, stage=_INT8),
    Precision("int8_weight_only", stage=_WEIGHT_ONLY),
    Precision("int4_weight_only", stage=_WEIGHT_ONLY),
    Precision("fp8", calibrates=True, quantizes=True, qdq_type="float8e4m3fn", stage=_FP8),
)
_REGISTRY: dict[str, Precision] = {p.name: p for p in _BUILT_IN}


def precision_names() -> tuple[str, ...]:
    """Every registered precision's name, built-ins first, in registration order."""
    return tuple(_REGISTRY)


def get_precision(value: str | Precision) -> Precision:
    """The registered precision named ``value`` (a :class:`Precision` is returned as it is).

    Raises:
        ValueError: no precision has that name; the message lists the valid ones.
    """
    if isinstance(value, Precision):
        return value
    if not isinstance(value, str) or value not in _REGISTRY:
        valid = ", ".join(map(repr, _REGISTRY))
        raise ValueError(f"invalid precision={value!r}; valid values: {valid}")
    return _REGISTRY[value]


def register_precision(precision: Precision) -> Precision:
    """Add ``precision`` to the registry, so every option and entry point accepts its name.

    Raises:
        ValueError: a precision of that name is already registered.
    """
    if not isinstance(precision, Precision):
        raise TypeError(f"register a Precision, not {type(precision).__name__}")
    if precision.name in _REGISTRY:
        raise ValueError(
            f"precision {precision.name!r} is already registered; choose another name or "
            "unregister_precision() it first"
        )
    _REGISTRY[precision.name] = precision
    return precision


def unregister_precision(name: str) -> Precision:
    """Remove the registered precision ``name`` (a built-in one cannot be removed).

    Raises:
        ValueError: ``name`` is built in or not registered.
    """
    if any(p.name == name for p in _BUILT_IN):
        raise ValueError(f"precision {name!r} is built in and cannot be unregistered")
    if name not in _REGISTRY:
        raise ValueError(f"precision {name!r} is not registered; registered: {precision_names()}")
    return _REGISTRY.pop(name)
