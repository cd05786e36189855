"""The one timer of ``bench/``: interleaved rounds, medians (standard library only).

Every speed in ``bench/`` is measured here, by :func:`interleaved` for calls timed against
each other and by :func:`stopwatch` / :func:`timed_call` for a single event (a first call, a
cold start). Nothing else in ``bench/`` reads a clock, so how a number was timed is decided in
one place, as Torch-TensorRT's ``tools/perf`` has one timer and pyperf one runner.

:func:`interleaved` calls the variants in rounds. In each round every block (a variant, or a
group of them such as one decoder's token counts) runs once, after a pause of
:data:`PAUSE_S` (one ONNX Runtime or OpenVINO session's spinning worker threads must not bill
the next variant; eager PyTorch suffers most), with ``warmup`` untimed calls and then
``repeat`` timed ones; the order rotates by one each round (the variant right after eager
PyTorch ran measurably faster on this machine, an order effect every variant should share).
On a shared machine whose speed drifts, neighbouring calls see the same load, so ratios taken
within one run hold where absolute times do not. Results are medians (``Timings.median``).

Peers that time themselves in their own process (llama.cpp, optimum-intel) join the rotation
as ``external`` blocks: a callable that runs one round there and returns its seconds.

This module imports nothing outside the standard library: the LLM peers' own virtual
environments (no torch in llama.cpp's) time with it too.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PAUSE_S", "Timings", "interleaved", "stopwatch", "timed", "timed_call"]

# seconds between blocks: a runtime's spinning worker threads settle before the next one runs
PAUSE_S = 0.05

External = Callable[[int], "Mapping[Hashable, float] | None"]


@dataclass
class Timings:
    """Seconds per call of each key, one list per round (``rounds[key][r]``)."""

    rounds: dict[Hashable, list[list[float]]] = field(default_factory=dict)

    def keys(self) -> list[Hashable]:
        """The keys that were timed, in the order they first ran."""
        return list(self.rounds)

    def samples(self, key: Hashable) -> list[float]:
        """Every timed sample of ``key``, round after round."""
        return [s for one in self.rounds[key] for s in one]

    def median(self, key: Hashable) -> float:
        """The median seconds per call of ``key`` over every sample."""
        return statistics.median(self.samples(key))

    def minimum(self, key: Hashable) -> float:
        """The fastest sample of ``key`` (for a roofline probe: the best the machine did)."""
        return min(self.samples(key))

    def round_medians(self, key: Hashable) -> list[float]:
        """The median of each round of ``key``, in order."""
        return [statistics.median(one) for one in self.rounds[key] if one]

    def medians(self) -> dict[Hashable, float]:
        """Key -> median seconds per call."""
        return {key: self.median(key) for key in self.rounds}


def _blocks(calls: Mapping[Hashable, Any], group: Callable[[Hashable], Hashable] | None):
    members: dict[Hashable, list[Hashable]] = {}
    for key in calls:
        members.setdefault(key if group is None else group(key), []).append(key)
    return members


def _time_key(fn: Callable[[], object], warmup: int, repeat: int, inner: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return samples


def interleaved(
    calls: Mapping[Hashable, Callable[[], object]],
    rounds: int,
    *,
    warmup: int = 1,
    repeat: int = 2,
    inner: int = 1,
    pause_s: float = PAUSE_S,
    group: Callable[[Hashable], Hashable] | None = None,
    external: Mapping[Hashable, External] | None = None,
    first_round: int = 0,
    mode: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Timings:
    """Time ``calls`` against each other in rotating rounds (see the module docstring).

    Args:
        calls: key -> a call taking no arguments (built and called once before: a first
            call's compile is never timed here).
        rounds: how many rounds.
        warmup: untimed calls of a key before its timed ones, in every round.
        repeat: timed samples of a key per round.
        inner: calls per sample, the sample being their mean (microsecond calls, where the
            clock's own cost would count).
        pause_s: the pause before each block.
        group: key -> its block (keys of one block run one after another, in order, and
            rotate together); None: every key is a block.
        external: block -> a callable that runs round ``r`` in its own process and returns
            key -> seconds (or None when it can run no more: the block is dropped).
        first_round: the index of the first round (the rotation starts there).
        mode: the context every call runs in (``torch.no_grad``: the grad mode the variants
            were compiled under, which Dynamo guards on).

    Returns:
        The :class:`Timings`.
    """
    members = _blocks(calls, group)
    external = dict(external or {})
    blocks = [*members, *(b for b in external if b not in members)]
    timings = Timings()
    with mode():
        for index in range(first_round, first_round + rounds):
            shift = index % max(len(blocks), 1)
            for block in blocks[shift:] + blocks[:shift]:
                if pause_s:
                    time.sleep(pause_s)
                if block in external:
                    reported = external[block](index)
                    if reported is None:
                        blocks.remove(block)
                        continue
                    for key, seconds in reported.items():
                        timings.rounds.setdefault(key, []).append([seconds])
                    continue
                for key in members[block]:
                    samples = _time_key(calls[key], warmup, repeat, inner)
                    timings.rounds.setdefault(key, []).append(samples)
    return timings


@contextlib.contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """Seconds since entering, frozen at exit: ``with stopwatch() as elapsed: ...; elapsed()``."""
    start, end = time.perf_counter(), []

    def elapsed() -> float:
        return (end[0] if end else time.perf_counter()) - start

    try:
        yield elapsed
    finally:
        end.append(time.perf_counter())


def timed_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` once: (its result, its seconds). For a first call."""
    with stopwatch() as elapsed:
        result = fn(*args, **kwargs)
    return result, elapsed()


def timed(fn: Callable[..., Any], spent: dict[str, float], name: str) -> Callable[..., Any]:
    """``fn`` adding the seconds of each call to ``spent[name]`` (a probe's nested timers)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with stopwatch() as elapsed:
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + elapsed()

    return call
