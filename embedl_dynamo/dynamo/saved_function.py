"""What an ``embedl_*`` backend returns when PyTorch's ``aot_compile`` asks for a callable it can
save: :class:`SavedFunction`, a ``torch._dynamo.aot_compile_types.SerializableCallable``.

**What deserialization receives, and so what is saved.** PyTorch saves Dynamo's bytecode and
guards itself, and when it loads, it hands the backend's class nothing but the bytes the backend
gave it (``deserialize_compile_artifacts(data)``); then it calls the result with Dynamo's flat
arguments: the model's parameters and buffers (from the module passed as ``external_data``) and
the inputs. The graph Dynamo traced is not handed back, so it is part of our bytes.

**Decision.** The bytes are one JSON document, never a pickle of our objects: the Dynamo graph
as data (:mod:`~embedl_dynamo.dynamo.graph_data`), the target and settings, the calibration
data's identity (its content key, not the data), the digests of the weights, the grad and
autocast state, and what each part of the graph loads (:mod:`~.saved_artifacts`: content keys
and digests, the report's status and reason). On the first call after a load the graph is
rebuilt from that data and compiled again by
:func:`~embedl_dynamo.dynamo.compile.compile_subgraph`, which finds every artifact in the cache
(or the bundle shipped with the file) by the same content keys and loads it: a warm start, with
no Dynamo trace and no pipeline stage. One path builds and loads, so freezing, partitioning,
per-call guards, write-back and the PyTorch fallback are those of any compiled graph. Before
it, the call's weights must be those saved (:mod:`~.saved_checks`) and each artifact present
with its saved digest; after it, each part must have loaded the artifact it was saved with.

**Only when asked.** The backend returns a :class:`SavedFunction` only inside
``aot_compile`` (:func:`aot_compile_requested`); ``torch.compile`` gets the plain callable.
Saving refuses what it cannot restore: a graph that trains, INT8 not calibrated yet, or a
partitioned graph calibrated on ``calibration_data`` (each fragment's data is fed through the
graph, and is not saved).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torch import fx, nn
from torch._dynamo.aot_compile_types import SerializableCallable

from embedl_dynamo.backend import Backend, backend_by_name
from embedl_dynamo.cache.files import default_cache_dir, wait_for_cache_writes
from embedl_dynamo.cache.keys import digests_reused
from embedl_dynamo.dynamo.compile import compile_subgraph
from embedl_dynamo.dynamo.example_values import add_example_values
from embedl_dynamo.dynamo.graph_data import graph_from_data, graph_to_data
from embedl_dynamo.dynamo.saved_artifacts import (
    artifact_records,
    artifacts_problem,
    restore_problems,
    write_bundle,
)
from embedl_dynamo.dynamo.saved_checks import call_state, weights_problem, weights_record
from embedl_dynamo.dynamo.warm_start import calibration_identity
from embedl_dynamo.errors import CalibrationDataError, SavedFunctionError
from embedl_dynamo.graph.analysis import analyze
from embedl_dynamo.graph.freeze import inference_blocker
from embedl_dynamo.report.record import last_report, next_index
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.registry import runtime_settings
from embedl_dynamo.settings import Settings

__all__ = [
    "FORMAT",
    "SavedCalibration",
    "SavedFunction",
    "aot_compile_requested",
    "loading",
    "saving",
]

logger = logging.getLogger(__name__)

#: the ``format`` of the JSON a :class:`SavedFunction` serializes to
FORMAT = "embedl_dynamo.saved_function/1"
_UNSAVED = ("calibration_data", "cache_dir", "progress")  # not data, or where, not what
# set by embedl_dynamo.save_compiled / load_compiled around PyTorch's save and load
_SAVING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "embedl_saving", default=None
)
_LOADING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "embedl_loading", default=None
)


def aot_compile_requested() -> bool:
    """Whether the calling backend runs inside PyTorch's ``aot_compile`` (which needs a
    callable it can save), not an ordinary ``torch.compile``."""
    from torch._dynamo import aot_compile

    code = aot_compile.aot_compile_fullgraph.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def saving(model: nn.Module, bundle: Path | None) -> Iterator[None]:
    """Around PyTorch's save: the model (names the weights by its state_dict) and the bundle
    directory to write the artifacts into (None: none)."""
    token = _SAVING.set({"model": model, "bundle": bundle})
    try:
        yield
    finally:
        _SAVING.reset(token)


@contextlib.contextmanager
def loading(cache_dir: Path | None) -> Iterator[list[SavedFunction]]:
    """Around PyTorch's load: the cache the functions loaded read (None: the environment's);
    yields the :class:`SavedFunction` objects deserialized inside."""
    loaded: list[SavedFunction] = []
    token = _LOADING.set({"cache_dir": cache_dir, "loaded": loaded})
    try:
        yield loaded
    finally:
        _LOADING.reset(token)


class SavedCalibration:
    """The calibration data of a saved INT8 function, by identity only: the warm start keys the
    graph with it (:func:`~embedl_dynamo.dynamo.warm_start.calibration_identity` reads
    ``saved_identity``). Run as a forward loop, it says the data was not saved."""

    def __init__(self, identity: str) -> None:
        self.saved_identity = identity

    def __call__(self, model: Any) -> None:
        raise CalibrationDataError(
            "a saved INT8 function found no artifact to load and cannot calibrate again: its "
            "calibration data is not saved with it. Load it with the cache or bundle it was "
            "saved with, or save it again"
        )


class SavedFunction(SerializableCallable):
    """A compiled Dynamo graph PyTorch can save and load (see the module).

    Args:
        record: the JSON-safe description that is its bytes.
        compiled: the compiled callable (None after a load, until the first call).
        weights: weak references to the weights (when compiled in this process).
    """

    def __init__(
        self,
        record: dict[str, Any],
        compiled: Callable[..., Any] | None = None,
        weights: Sequence[Any] = (),
    ) -> None:
        self.record = record
        self.report: SubgraphReport | None = None  # of the compile, or of the load's warm start
        self.cache_dir: Path | None = None  # where a loaded one reads its artifacts
        self._built_here = compiled is not None
        self._compiled = compiled
        self._weights = list(weights)
        self._lock = threading.Lock()

    @classmethod
    def compiled_by(
        cls,
        compile_graph: Callable[[fx.GraphModule, Sequence[Any], Backend, Settings], Any],
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        backend: Backend,
        settings: Settings,
    ) -> SavedFunction:
        """``compile_graph``'s callable for ``gm`` in the saveable form (see the module).

        Raises:
            SavedFunctionError: the graph cannot be saved as data (a submodule, a function
                outside :data:`~embedl_dynamo.dynamo.graph_data.MODULES`, a dynamic size).
        """
        graph = graph_to_data(gm)  # before any work: a graph that cannot be saved says so
        compiled, report = _compiled_with_report(
            compile_graph, gm, example_inputs, backend, settings
        )
        analysis = analyze(gm)  # for the record: compile_graph analysed its own
        weights, refs = weights_record(gm, example_inputs, analysis)
        options = {k: v for k, v in settings.to_dict().items() if k not in _UNSAVED}
        record = {
            "format": FORMAT,
            "target": backend.name,
            "settings": options,
            "calibration": _calibration(settings, gm, example_inputs, weights["positions"]),
            "state": call_state(),
            "graph": graph,
            "weights": weights,
            "cache_dir": str(settings.cache_dir),
            "blocker": inference_blocker(gm, example_inputs, analysis),
        }
        fn = cls(record, compiled, refs)
        fn.report = report
        return fn

    @classmethod
    def serialize_compile_artifacts(cls, fn: SavedFunction) -> bytes:
        """The function's JSON, with what it loads (see :meth:`to_record`)."""
        return json.dumps(fn.to_record(), sort_keys=True).encode()

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> SavedFunction:
        """The function :meth:`serialize_compile_artifacts` wrote; compiled on its first call."""
        try:
            record = json.loads(data)
        except ValueError as exc:
            raise SavedFunctionError(f"a saved compiled function is not JSON ({exc})") from exc
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            found = record.get("format") if isinstance(record, dict) else type(record).__name__
            raise SavedFunctionError(
                f"saved compiled function has format {found!r}, this package reads {FORMAT!r}: "
                "save it again with this version"
            )
        fn = cls(record)
        context = _LOADING.get()
        if context is not None:
            fn.cache_dir = context["cache_dir"]
            context["loaded"].append(fn)
        return fn

    def to_record(self) -> dict[str, Any]:
        """The JSON record with the artifacts as they are now, and a bundle written when
        :func:`saving` asks.

        Raises:
            SavedFunctionError: the graph cannot be restored from a file (see the module).
        """
        record = dict(self.record)
        if not self._built_here:  # loaded, and saved again: what it was saved with
            return record
        _refuse_unsaveable(self.report, record)
        cache_dir = Path(record["cache_dir"])
        report = self.report
        wait_for_cache_writes()  # an artifact stored on a helper thread is recorded stored
        record["artifacts"] = artifact_records(report, cache_dir) if report is not None else []
        unstored = [a for a in record["artifacts"] if "key" in a and a["digest"] is None]
        if unstored:
            raise SavedFunctionError(
                f"the {unstored[0]['part']}'s artifact is not in the cache at {cache_dir} (a "
                "read-only or full cache builds without storing), so nothing could load it: "
                "save it with a cache it can write (cache_dir=)"
            )
        if report is not None:
            record["report"] = {
                "status": report.status,
                "runtime": report.runtime,
                "reason": report.reason,
            }
        context = _SAVING.get()
        if context is not None:
            record["weights"] = dict(record["weights"], state_names=self._state_names(context))
            record["model_class"] = type(context["model"]).__qualname__
            if context["bundle"] is not None:
                wait_for_cache_writes()  # what the runtimes derive is written in the background
                write_bundle(record["artifacts"], cache_dir, context["bundle"])
        return record

    def _state_names(self, context: dict[str, Any]) -> list[str] | None:
        """The weights' names in the saving model's state_dict (None: one is not found)."""
        model = context["model"]
        by_id = {id(t): n for n, t in model.named_parameters(remove_duplicate=False)}
        by_id.update((id(t), n) for n, t in model.named_buffers(remove_duplicate=False))
        names = [by_id.get(id(ref())) if ref() is not None else None for ref in self._weights]
        return names if all(names) else None

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            with self._lock:
                if self._compiled is None:
                    self._compiled = self._restore(args)
                compiled = self._compiled
        return compiled(*args)

    def _restore(self, args: Sequence[Any]) -> Callable[..., Any]:
        """The saved graph compiled again on the first call's arguments (a warm start)."""
        record = self.record
        tensors = [args[i] for i in record["weights"]["positions"]]
        problem = weights_problem(record["weights"], tensors)
        if problem is not None:
            raise SavedFunctionError(
                f"this saved compiled function cannot run on these weights: {problem}. Load it "
                "with the model it was saved with, or save it again for these weights"
            )
        settings = self._settings()
        gm = graph_from_data(record["graph"])
        add_example_values(gm, args)
        backend = backend_by_name(record["target"])

        def compile_graph(gm: fx.GraphModule, inputs: Sequence[Any], *_: Any) -> Any:
            with digests_reused():
                return compile_subgraph(gm, list(inputs), backend, settings)

        compiled, self.report = _compiled_with_report(compile_graph, gm, args, backend, settings)
        errors, told = restore_problems(record.get("artifacts", []), self.report)
        if errors:
            raise SavedFunctionError(f"this saved compiled function did not load: {errors[0]}")
        for line in told:
            warnings.warn(f"embedl_{backend.name}: saved function: {line}", RuntimeWarning, 3)
        return compiled

    def _settings(self) -> Settings:
        """The saved settings, reading the saved artifacts' cache (see :meth:`artifacts_dir`).

        Raises:
            SavedFunctionError: no cache holds every saved artifact with its digest.
        """
        options = dict(self.record["settings"])
        options["cache_dir"] = self.artifacts_dir()
        identity = self.record.get("calibration")
        if identity is not None:
            options["calibration_data"] = SavedCalibration(identity)
        return runtime_settings(options)

    def artifacts_dir(self) -> Path:
        """The cache the saved artifacts are read from: the one :func:`loading` named (a
        bundle), else the environment's cache, else the saving process's if it is here.

        Raises:
            SavedFunctionError: the artifacts are not there, or are not the saved ones.
        """
        artifacts = self.record.get("artifacts", [])
        saved = Path(self.record.get("cache_dir") or default_cache_dir())
        places = [self.cache_dir] if self.cache_dir is not None else [default_cache_dir(), saved]
        problems = [artifacts_problem(artifacts, place) for place in places]
        for place, problem in zip(places, problems):
            if problem is None:
                return place
        raise SavedFunctionError(f"this saved compiled function cannot load: {problems[0]}")


def _compiled_with_report(
    compile_graph: Callable[..., Any],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend,
    settings: Settings,
) -> tuple[Callable[..., Any], SubgraphReport | None]:
    """``compile_graph``'s callable and the report it recorded (None: it recorded none)."""
    index = next_index()
    compiled = compile_graph(gm, example_inputs, backend, settings)
    report = getattr(compiled, "embedl_report", None)
    if report is None:  # it runs in PyTorch: its report, where one was recorded
        recorded = [r for r in last_report() if r.index == index and r.backend == backend.name]
        report = recorded[-1] if recorded else None
    return compiled, report


def _calibration(
    settings: Settings, gm: fx.GraphModule, example_inputs: Sequence[Any], weights: list[int]
) -> str | None:
    """The identity of the calibration data the graph was keyed with (None: no data)."""
    if not settings.precision.calibrates or settings.calibration_data is None:
        return None
    return calibration_identity(settings, _GraphModel(gm, example_inputs, weights))


class _GraphModel(nn.Module):
    """Dynamo's graph as a model of its inputs only (its weights bound), for a forward loop's
    fingerprint: what it feeds the frozen graph, it feeds this."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], weights: list[int]):
        super().__init__()
        self.gm, self.args = gm, list(example_inputs)
        self.user = [i for i in range(len(self.args)) if i not in set(weights)]

    def forward(self, *inputs: Any) -> Any:
        args = list(self.args)
        for position, value in zip(self.user, inputs):
            args[position] = value
        return self.gm(*args)


def _refuse_unsaveable(report: SubgraphReport | None, record: dict[str, Any]) -> None:
    """Raise where the compiled graph could not be restored from the saved data."""
    if record.get("blocker"):
        raise SavedFunctionError(
            f"this graph runs in PyTorch, not frozen for inference ({record['blocker']}), so "
            "nothing compiled is there to save: save it under torch.no_grad() with the model "
            "in eval mode"
        )
    if report is None:
        return
    parts = report.partitions or [report]
    pending = [p for p in parts if p.calibrating]
    if pending:
        raise SavedFunctionError(
            f"INT8 has not calibrated yet ({pending[0].reason}); call the function that many "
            "times before saving it, or pass calibration_data"
        )
    if report.partitions and record.get("calibration") is not None:
        raise SavedFunctionError(
            "a partitioned graph calibrated on calibration_data cannot be saved (each "
            "fragment's calibration data is not saved); compile it without calibration_data "
            "(it calibrates on its first calls, then save), or use embedl_dynamo.export"
        )
