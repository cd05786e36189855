"""Quantization specs: per role (activation, weight, bias, output) how a tensor is quantized.

In the spirit of torch.ao's ``DTypeConfig`` / ``BackendPatternConfig`` and PT2E's
``QuantizationSpec``: frozen dataclasses that validate themselves, so a bad config fails when it
is built, not deep inside calibration. A :class:`QuantizationConfig` maps each
:class:`~embedl_dynamo.rewrite.pattern.Role` to a :class:`QuantizationSpec` and is what
``Backend.quantization`` holds; ``to_dict``/``from_dict`` round-trip through JSON.

The integer grid of a spec: ``q = clamp(round(x / scale) + zero_point, qmin, qmax)``.
Symmetric specs have ``zero_point = 0`` (``128`` for uint8) and ``scale = amax / 127`` (narrow
range for weights); affine specs map ``[min, max]`` (widened to contain 0) onto ``[qmin, qmax]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from embedl_dynamo.rewrite.qdq import Role
from embedl_dynamo.settings import OBSERVERS

__all__ = [
    "DTYPES",
    "OBSERVERS",
    "ONNXRUNTIME_INT8",
    "OPENVINO_INT8",
    "TENSORRT_INT8",
    "QuantizationConfig",
    "QuantizationSpec",
]

# dtype name -> (qmin, qmax)
DTYPES: dict[str, tuple[int, int]] = {"int8": (-128, 127), "uint8": (0, 255)}


@dataclass(frozen=True)
class QuantizationSpec:
    """How one tensor is quantized.

    Attributes:
        dtype: ``"int8"`` or ``"uint8"``.
        symmetric: zero point fixed at the middle of the range (``0`` for int8).
        per_channel: one scale per slice along ``axis`` (weights), else one per tensor.
        axis: the channel axis when ``per_channel``.
        narrow_range: use ``[-127, 127]`` for int8 (TensorRT's and ModelOpt's weight grid).
        observer: calibration method: ``minmax``, ``mean_minmax``, ``percentile``, ``mse`` or
            ``entropy``.
        percentile: the percentile kept by the ``percentile`` observer.
        unsigned_nonnegative: a symmetric int8 tensor whose calibrated range holds no
            negative value is quantized as uint8 over ``[0, max]`` (zero point 0) instead: one
            more bit for post-ReLU activations (NNCF's convention for OpenVINO; TensorRT takes
            signed int8 only).
    """

    dtype: str = "int8"
    symmetric: bool = True
    per_channel: bool = False
    axis: int | None = None
    narrow_range: bool = False
    observer: str = "minmax"
    percentile: float = 99.99
    unsigned_nonnegative: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {sorted(DTYPES)}")
        if self.observer not in OBSERVERS:
            raise ValueError(f"unknown observer {self.observer!r}; known: {list(OBSERVERS)}")
        if self.per_channel and self.axis is None:
            raise ValueError("a per-channel spec needs an axis (e.g. axis=0 for conv weights)")
        if not self.per_channel and self.axis is not None:
            raise ValueError(f"axis={self.axis} given for a per-tensor spec; set per_channel=True")
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.narrow_range and self.dtype != "int8":
            raise ValueError("narrow_range applies to int8 only")
        if self.unsigned_nonnegative and not (self.dtype == "int8" and self.symmetric):
            raise ValueError("unsigned_nonnegative applies to symmetric int8 specs only")
        if self.unsigned_nonnegative and self.per_channel:
            raise ValueError("unsigned_nonnegative applies to per-tensor (activation) specs only")

    @property
    def qmin(self) -> int:
        return DTYPES[self.dtype][0] + (1 if self.narrow_range else 0)

    @property
    def qmax(self) -> int:
        return DTYPES[self.dtype][1]

    def for_range(self, lo: float) -> QuantizationSpec:
        """The spec a tensor whose calibrated minimum is ``lo`` is quantized with: uint8 affine
        (zero point 0 for a range starting at 0) under ``unsigned_nonnegative``, else this."""
        if self.unsigned_nonnegative and lo >= 0.0:
            return replace(self, dtype="uint8", symmetric=False, unsigned_nonnegative=False)
        return self

    def with_observer(self, observer: str) -> QuantizationSpec:
        """A copy with another calibration method (validated)."""
        return replace(self, observer=observer)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "symmetric": self.symmetric,
            "per_channel": self.per_channel,
            "axis": self.axis,
            "narrow_range": self.narrow_range,
            "observer": self.observer,
            "percentile": self.percentile,
            "unsigned_nonnegative": self.unsigned_nonnegative,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizationSpec:
        known = set(cls().to_dict())
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown QuantizationSpec fields {unknown}; known: {sorted(known)}")
        return cls(**dict(data))


@dataclass(frozen=True)
class QuantizationConfig:
    """A target's INT8 scheme: a :class:`QuantizationSpec` per :class:`Role`.

    Attributes:
        specs: role -> spec; ``ACTIVATION`` and ``WEIGHT`` are required. A missing ``OUTPUT``
            falls back to ``ACTIVATION``; a missing ``BIAS`` leaves biases in float (the
            runtime requantizes them to int32 itself).
        name: a label for reports (``"tensorrt"``).
    """

    specs: Mapping[Role, QuantizationSpec] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        specs = {}
        for role, spec in dict(self.specs).items():
            role = Role(role) if not isinstance(role, Role) else role
            if not isinstance(spec, QuantizationSpec):
                raise TypeError(f"spec for {role.value} must be a QuantizationSpec, got {spec!r}")
            specs[role] = spec
        for required in (Role.ACTIVATION, Role.WEIGHT):
            if required not in specs:
                raise ValueError(f"QuantizationConfig needs a spec for {required.value!r}")
        object.__setattr__(self, "specs", specs)

    def spec(self, role: Role) -> QuantizationSpec | None:
        """The spec for ``role`` (``OUTPUT`` falls back to ``ACTIVATION``)."""
        if role in self.specs:
            return self.specs[role]
        if role is Role.OUTPUT:
            return self.specs[Role.ACTIVATION]
        return None

    def with_observer(self, observer: str) -> QuantizationConfig:
        """A copy whose activation-like specs use ``observer`` (weights keep min/max)."""
        specs = {
            r: (s.with_observer(observer) if r in (Role.ACTIVATION, Role.OUTPUT) else s)
            for r, s in self.specs.items()
        }
        return QuantizationConfig(specs, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "specs": {r.value: s.to_dict() for r, s in sorted(self.specs.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizationConfig:
        if "specs" not in data:
            raise ValueError("QuantizationConfig dict needs a 'specs' mapping of role -> spec")
        known = [r.value for r in Role]
        specs = {}
        for role, spec in data["specs"].items():
            if role not in known:
                raise ValueError(f"unknown role {role!r}; known: {known}")
            specs[Role(role)] = QuantizationSpec.from_dict(spec)
        return cls(specs, data.get("name", ""))


TENSORRT_INT8 = QuantizationConfig(
    {
        Role.ACTIVATION: QuantizationSpec("int8", symmetric=True),
        Role.WEIGHT: QuantizationSpec(
            "int8", symmetric=True, per_channel=True, axis=0, narrow_range=True
        ),
    },
    name="tensorrt",
)
"""TensorRT explicit quantization: symmetric int8, per-channel weights on axis 0."""

ONNXRUNTIME_INT8 = QuantizationConfig(
    {
        Role.ACTIVATION: QuantizationSpec("uint8", symmetric=False),
        Role.WEIGHT: QuantizationSpec("int8", symmetric=True, per_channel=True, axis=0),
    },
    name="onnxruntime",
)
"""ONNX Runtime CPU: uint8 affine activations, int8 symmetric per-channel weights."""

OPENVINO_INT8 = QuantizationConfig(
    {
        Role.ACTIVATION: QuantizationSpec(
            "int8", symmetric=True, unsigned_nonnegative=True, observer="mean_minmax"
        ),
        Role.WEIGHT: QuantizationSpec(
            "int8", symmetric=True, per_channel=True, axis=0, narrow_range=True
        ),
    },
    name="openvino",
)
"""OpenVINO CPU (NNCF's performance preset): symmetric activations, uint8 over [0, max] where
they hold no negative value, else int8, their ranges the mean of each calibration batch's min
and max (NNCF's ``MEAN_MINMAX``); symmetric int8 weights per channel on axis 0."""
