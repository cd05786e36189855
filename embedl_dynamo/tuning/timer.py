"""The one speed contest of tuning/: time named options round-robin and pick the fastest.

Every choice made by measuring speed (the runtime among several CPU runtimes, the whole graphs
``mixed`` compares) goes through here, so each is timed and decided the same way:

* :func:`time_options`: one warm-up call of each option, then rounds that call every option in
  turn, twice, timing the second call (one runtime's spinning worker threads must not bill the
  next); an option whose last call took :data:`LONG_CALL_S` or more gets a pause of
  :data:`SETTLE_S` instead of the untimed call, as ``bench/``'s timer pauses between variants
  (for a large graph, the untimed calls were most of the contest's time). Rounds go on until :data:`BUDGET_S` of timed work is spent (at least
  :data:`MIN_ROUNDS`, at most :data:`MAX_ROUNDS`), or sooner once every round ranked the same
  option first by :data:`CLEAR` (large graphs: a few rounds settle it, and more would only
  lengthen the compile), or when there is one option only. The statistic is each option's median.
* :func:`fastest_of`: the fastest of timed options, where a challenger (a lower precision
  against float, a compiled runtime against PyTorch itself) must take at most
  :data:`~embedl_dynamo.tuning.judge.LOWER_PRECISION_MARGIN` of the time of the others, so timing
  noise cannot pick it; ties favour the earlier option.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Mapping

from embedl_dynamo.tuning.judge import LOWER_PRECISION_MARGIN

__all__ = [
    "BUDGET_S",
    "CLEAR",
    "LONG_CALL_S",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "SETTLE_S",
    "WARMUP",
    "fastest_of",
    "time_options",
]

WARMUP = 1  # untimed calls of each option first (each also ran once when it was built)
MIN_ROUNDS = 3
MAX_ROUNDS = 40
BUDGET_S = 1.0  # rounds stop once this much time went into them (after MIN_ROUNDS)
CLEAR = 1.05  # ...or once the same option led every round by this factor
LONG_CALL_S = 0.1  # an option whose calls take this long...
SETTLE_S = 0.05  # ...settles for this long before its timed call, instead of an untimed call


def _decided(samples: dict[str, list[float]]) -> bool:
    """Whether every round ranked the same option first, ahead of the others by :data:`CLEAR`."""
    rounds = list(zip(*samples.values()))
    winners = {min(range(len(r)), key=r.__getitem__) for r in rounds}
    if len(winners) != 1:
        return False
    best = winners.pop()
    return all(min(t for i, t in enumerate(r) if i != best) > r[best] * CLEAR for r in rounds)


def time_options(
    options: Mapping[str, Callable[[], object]],
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], object] = time.sleep,
) -> dict[str, float]:
    """Median milliseconds per call of each option, timed round-robin (see the module docstring).

    Args:
        options: name -> a call to time (a built runtime on the example inputs).
        clock: seconds, monotonic (tests pass a fake one).
        sleep: waits the seconds given (tests pass a fake one).

    Returns:
        Name -> median ms, in the order of ``options``.
    """
    last = {name: _warmed_up(call, clock) for name, call in options.items()}
    samples: dict[str, list[float]] = {name: [] for name in options}
    spent, rounds = 0.0, 0
    while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or spent < BUDGET_S):
        for name, call in options.items():
            if last[name] >= LONG_CALL_S:
                sleep(SETTLE_S)
                spent += SETTLE_S
            else:
                call()
                spent += last[name]
            start = clock()
            call()
            last[name] = clock() - start
            samples[name].append(last[name])
            spent += last[name]
        rounds += 1
        if rounds >= MIN_ROUNDS and (len(options) < 2 or _decided(samples)):
            break
    return {name: statistics.median(v) * 1000.0 for name, v in samples.items()}


def _warmed_up(call: Callable[[], object], clock: Callable[[], float]) -> float:
    """Seconds of the last of :data:`WARMUP` untimed calls of ``call`` (0.0 for none)."""
    elapsed = 0.0
    for _ in range(WARMUP):
        start = clock()
        call()
        elapsed = clock() - start
    return elapsed


def fastest_of(timings: Mapping[str, float], must_beat: Collection[str] = ()) -> str:
    """The fastest option; one in ``must_beat`` must take at most
    :data:`~embedl_dynamo.tuning.judge.LOWER_PRECISION_MARGIN` of another's time to beat it.

    Args:
        timings: name -> time (any unit), best first: ties favour the earlier.
        must_beat: the names of the challengers: lower-precision options (INT8, mixed, ...)
            against float, a compiled runtime against eager (:mod:`.beat_eager`).

    Returns:
        The winning name.

    Raises:
        ValueError: when ``timings`` is empty.
    """
    if not timings:
        raise ValueError("no timed option to choose from; time at least one option first")

    def score(name: str) -> float:
        margin = LOWER_PRECISION_MARGIN if name in must_beat else 1.0
        return timings[name] / margin

    return min(timings, key=score)
