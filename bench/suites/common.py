"""What the model suites share: build each variant of a case, call it once, time them together.

:func:`measure` builds every variant of one model at one params set (a
:class:`~bench.variants.Case`) and calls each once: that call's seconds are its first call
(building the variant included: our compile, a peer's conversion, quantization and compile),
reported and never timed with the others; its output gives the cosine to eager; the resident
memory before and after gives what the build left held. Then it times them all together with
the one timer (:func:`bench.harness.timer.interleaved`) and adds the rows. A variant that fails
to build or to run is a row with its one-line reason, not a failed case. A conversion several
variants share (OpenVINO's, NNCF's) is billed to the first of them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from bench import models
from bench.harness.measure import cosine, first_tensor, one_line, resident_gb
from bench.harness.record import Record
from bench.harness.timer import interleaved, stopwatch
from bench.variants import Built, Case, builder

__all__ = ["built_models", "measure", "split_names", "zoo_names"]


def zoo_names() -> list[str]:
    """The test suite's zoo (``tests/zoo``) as registry names (``zoo:<name>``); a checkout
    without the test zoo: the registry's small models."""
    try:
        from tests.zoo import ZOO
    except ImportError:
        return ["tiny_cnn", "mlp", "resnet50_nn"]
    return [f"zoo:{name}" for name in ZOO]


def split_names(text: str) -> list[str]:
    """A comma-separated option as a list (empty items dropped)."""
    return [item for item in text.split(",") if item]


def built_models(names: str, record: Record) -> Iterator[tuple[str, Any, tuple[Any, ...]]]:
    """``(name, model, inputs)`` for each comma-separated name (none: :func:`zoo_names`); a
    model that does not build is a failed row of ``record``, not the end of the run."""
    for name in split_names(names) or zoo_names():
        try:
            model, inputs = models.build(name)
        except Exception as error:  # a model that does not build is a row, not the end
            record.fail(name, "model", one_line(error))
            continue
        yield name, model, inputs


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 2)


def _first_call(
    record: Record, case: Case, name: str, where: dict[str, Any], mode: Callable
) -> Built | None:
    """Build ``name`` and call it once; add its first-call, cosine and memory rows."""
    model, params, expected = where["model"], where["params"], where["expected"]
    held = resident_gb() if where["memory"] else None
    try:
        with stopwatch() as elapsed:  # a peer's conversion and ours' compile alike
            built = builder(name)(case, name)
            with mode():
                output = built.call()
        seconds = elapsed()
        info = built.describe() if built.describe else {}
    except Exception as error:  # a variant failing is a cell, not the case
        record.fail(model, name, one_line(error), params=params)
        print(f"  {model} {name}: fails: {one_line(error)}", flush=True)
        return None
    where["info"][name] = info
    if name != record.baseline:
        record.add(model, name, "first_call", round(seconds, 2), "s", params=params)
        value = round(cosine(first_tensor(output), expected), 5)
        record.add(model, name, "cosine", value, "cosine", params=params)
    if where["memory"]:
        record.add(model, name, "held", _delta(resident_gb(), held), "GB", params=params)
    return built


def measure(
    record: Record,
    case: Case,
    variants: Sequence[str],
    *,
    model: str,
    params: dict[str, Any],
    rounds: int,
    mode: Callable[[], contextlib.AbstractContextManager] = torch.no_grad,
    memory: bool = True,
) -> None:
    """Every variant of ``case`` built, called once, then timed together (module docstring);
    ``memory=False`` leaves out the memory rows (each reading collects garbage first: most of
    a smoke run's time on a loaded machine)."""
    with mode():
        expected = first_tensor(case.model(*case.inputs))
    where: dict[str, Any] = {
        "model": model,
        "params": params,
        "expected": expected,
        "info": {},
        "memory": memory,
    }
    built: dict[str, Built] = {}
    for name in variants:
        found = _first_call(record, case, name, where, mode)
        if found is not None:
            built[name] = found
    gc.collect()  # rejected candidates' sessions go before timing starts
    if memory:
        record.add(model, "process", "resident", resident_gb(), "GB", params=params)
    try:
        timings = interleaved({n: b.call for n, b in built.items()}, rounds, mode=mode)
    except Exception as error:  # a variant failing inside the rounds fails the timing only
        for name in built:
            record.fail(model, name, f"timing: {one_line(error)}", params=params)
        return
    for name, made in built.items():
        ms = round(timings.median(name) * 1e3, 3)
        info = where["info"].get(name) or None
        record.add(model, name, "latency", ms, "ms", params=params, tool=made.tool, info=info)
