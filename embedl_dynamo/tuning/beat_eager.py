"""Beats eager, or eager runs: a compiled subgraph must be faster than PyTorch running it.

A runtime's call has a fixed cost (inputs in, outputs out, its own dispatch) that a small graph
may not earn back, and some ops run slower on a runtime than in PyTorch (a ``scatter_add``, a
``grid_sample``): such a graph runs faster in PyTorch than on any runtime. So, as AITune
does, the runtime ``runtime="auto"`` chose must beat Dynamo's own graph run in PyTorch by the
margin every speed decision uses (:func:`~.timer.fastest_of`: at most
:data:`~embedl_dynamo.tuning.judge.LOWER_PRECISION_MARGIN` of eager's time), or the original
graph runs in PyTorch, as every other fallback does; one warning and the report give both
medians (``eager: 0.41 ms, onnxruntime: 0.55 ms; runs in PyTorch``). Timing eager costs a few
of its calls (one to warm up, two a round, three rounds where the lead is clear), once per
architecture.

Eager is one more option of the runtime contest (:func:`~.runtime_choice.fastest`): timed in
the same rounds as the runtimes by the same timer (with one runtime, a contest of two), and
its decision cached with theirs (architecture, threads, library versions, CPU), so a later
compile times nothing; a warm start reads the decision from the subgraph's alias and builds
nothing. Eager is not timed (:func:`times_eager`) where it cannot win or is not what was asked:

* ``beat_eager=False``;
* a forced runtime (``runtime="onnxruntime"``): the user's choice, used as it is;
* a precision other than ``fp32`` and ``mixed``: ``int8``, ``fp16``/``bf16``, ``fp8`` and the
  weight-only precisions are asked for by name (for memory, or for that precision's kernels),
  and eager would run fp32 (a slower ``int8`` is said by :mod:`.int8_speed`); ``mixed`` asks
  for speed within ``accuracy_budget``, which eager's fp32 meets;
* a graph on a CUDA device (no runtime contest runs there);
* a graph a family rule settles (:mod:`.runtime_rules`: a large transformer, which its leader
  runs several times faster than eager): nothing is timed there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.registry import AUTO
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.timer import fastest_of

__all__ = ["EAGER", "EagerSpeed", "compiled_beats_eager", "times_eager", "warn_eager_faster"]

logger = logging.getLogger(__name__)

EAGER = EagerRuntime.name  # eager's label in the runtime contest


@dataclass(frozen=True)
class EagerSpeed:
    """The fastest compiled option's median and eager's (ms per call) of one subgraph.

    Attributes:
        runtime: the compiled option's label (``onnxruntime``, ``openvino mixed``).
        runtime_ms: its median.
        eager_ms: eager's median.
    """

    runtime: str
    runtime_ms: float
    eager_ms: float

    @property
    def reason(self) -> str:
        """The report's reason when eager runs."""
        return (
            f"eager: {self.eager_ms:.2f} ms, {self.runtime}: {self.runtime_ms:.2f} ms; "
            "runs in PyTorch"
        )

    def to_dict(self) -> dict[str, float | str]:
        """The record the report and the caches keep (``pipeline["eager_speed"]``)."""
        return {"runtime": self.runtime, "runtime_ms": self.runtime_ms, "eager_ms": self.eager_ms}

    @classmethod
    def from_dict(cls, record: Mapping[str, object]) -> EagerSpeed:
        """The speeds :meth:`to_dict` wrote (raises ValueError, TypeError or KeyError)."""
        runtime, ms, eager = record["runtime"], record["runtime_ms"], record["eager_ms"]
        if not isinstance(runtime, str) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (ms, eager)
        ):
            raise ValueError(f"eager speed record {dict(record)!r}")
        return cls(runtime, float(ms), float(eager))  # type: ignore[arg-type]


def times_eager(settings: Settings, on_cuda: bool) -> bool:
    """Whether the runtime contest times eager for a subgraph compiled with ``settings``
    (see the module docstring; the family rule is :func:`~.runtime_choice.fastest`'s)."""
    precision = settings.precision
    return (
        settings.beat_eager
        and settings.runtime == AUTO
        and not on_cuda
        and (not precision.lower or precision.per_layer)
    )


def compiled_beats_eager(speed: EagerSpeed) -> bool:
    """Whether the compiled option beats eager by the margin: it takes at most
    :data:`~embedl_dynamo.tuning.judge.LOWER_PRECISION_MARGIN` of eager's time
    (:func:`~.timer.fastest_of`)."""
    timings = {speed.runtime: speed.runtime_ms, EAGER: speed.eager_ms}
    return fastest_of(timings, must_beat={speed.runtime}) == speed.runtime


def warn_eager_faster(speed: EagerSpeed, index: int) -> None:
    """The one warning that eager beat the runtimes (at the decision, and at every warm start
    of it)."""
    logger.warning(
        "subgraph %d: %s measured slower than PyTorch (%.2f ms against eager's %.2f ms); it "
        "runs in PyTorch. beat_eager=False keeps the runtime",
        index,
        speed.runtime,
        speed.runtime_ms,
        speed.eager_ms,
    )
