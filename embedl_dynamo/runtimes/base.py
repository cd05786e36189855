"""The runtime lifecycle, modelled on NVIDIA AITune's ``Backend``.

* :meth:`Runtime.build` turns a transformed GraphModule and example inputs into something that
  runs. It is idempotent and runs the sample at most once (its outputs go to the ``judge`` the
  caller gives, :func:`embedl_dynamo.tuning.judge.judge_artifact`; no verdict is made here), so a
  model with state sees exactly one call per sample. After ``build`` the runtime is active.
* :meth:`Runtime.activate` / :meth:`Runtime.deactivate` acquire and release what inference
  needs (a session, an execution context); a deactivated runtime refuses :meth:`Runtime.infer`.
* :meth:`Runtime.key` is its cache key and :meth:`Runtime.describe` one line for reports;
  :meth:`Runtime.to_dict` / :meth:`Runtime.from_dict` a loaded runtime's state (``load()``).

A runtime class also declares its facts, so no table elsewhere tests its name: :attr:`~Runtime.name`,
:attr:`~Runtime.artifact_suffixes`, :attr:`~Runtime.cuda_only`, :meth:`~Runtime.cuda_missing`,
:attr:`~Runtime.auto_rank`, :attr:`~Runtime.cpu_target`, :meth:`~Runtime.version` (keys every cached decision timed on it),
:meth:`~Runtime.layer_profiler` and :meth:`~Runtime.lint`. The registry
(:mod:`embedl_dynamo.runtimes.registry`) is the one list of runtime classes.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import fx

from embedl_dynamo.backend import Backend
from embedl_dynamo.cache.keys import version_of
from embedl_dynamo.errors import RuntimeUnavailableError
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.runtimes.reference import graph_outputs
from embedl_dynamo.runtimes.served import CheckedCall, Served
from embedl_dynamo.settings import Settings

if TYPE_CHECKING:
    import onnx

#: what a layer profiler is: ``(onnx_path, inputs, runs, num_threads) -> {node name: ms per run}``
LayerProfiler = Callable[[Path, Sequence[torch.Tensor], int, "int | None"], dict[str, float]]

__all__ = [
    "ArtifactJudge",
    "LayerProfiler",
    "PROFILE_WARMUP_RUNS",
    "Runtime",
    "target_device",
]

logger = logging.getLogger(__name__)


# untimed runs before a per-layer profile: thread pools and allocators settle
PROFILE_WARMUP_RUNS = 5


def _same_device(asked: torch.device, actual: torch.device) -> bool:
    """Whether ``asked`` names ``actual`` (a device without an index names its current one)."""
    return asked.type == actual.type and asked.index in (None, actual.index)


def target_device() -> torch.device:
    """The CUDA device engines are built for and run on (the current one)."""
    return torch.device("cuda", torch.cuda.current_device())


#: how a runtime's caller judges the artifact's outputs on the build sample:
#: ``judge(gm, reference, actual, what)`` raises :class:`OutputMismatchError` to reject them
#: (``reference()`` gives ``gm``'s outputs); the verdict itself lives above the runtimes, in
#: :func:`embedl_dynamo.tuning.judge.judge_artifact`
# (graph, its reference outputs, the artifact's outputs, what it is, the runtime's float bound)
ArtifactJudge = Callable[
    [fx.GraphModule, Callable[[], tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...], str, float],
    None,
]


class Runtime(ABC):
    """One way to run a transformed graph. Subclasses set :attr:`name` and implement the hooks.

    Args:
        settings: the compile settings (cache directory, threads, dynamic batch...).
        dynamic_axes: the axes the artifact must keep dynamic (from the Dynamo graph's symbolic
            sizes); None: dim 0 where ``settings.dynamic_batch`` says.
    """

    #: the name ``runtime=`` takes
    name: ClassVar[str] = ""
    #: file suffixes of prebuilt artifacts :meth:`load_artifact` takes (``load()`` maps on them)
    artifact_suffixes: ClassVar[tuple[str, ...]] = ()
    #: runs only on a CUDA device: ``auto`` skips it for a graph on the CPU
    cuda_only: ClassVar[bool] = False
    #: where ``auto`` tries it among a target's runtimes when the target names none (higher
    #: first; equal ranks keep the registry's order)
    auto_rank: ClassVar[int] = 0
    #: the target whose INT8 placement this CPU runtime turns into integer kernels (None: it
    #: runs the placement of the target it is given)
    cpu_target: ClassVar[Backend | None] = None
    #: how far a float artifact's outputs may be from the graph's, relative to each output's
    #: scale (:func:`~embedl_dynamo.tuning.judge.check_float`): float32 kernels reorder sums
    float_rtol: ClassVar[float] = 1e-4
    #: compiles inside its first :meth:`infer` for each input shape (Torch-TensorRT's JIT);
    #: False: :meth:`build` produces everything inference runs
    is_jit: ClassVar[bool] = False

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        self.dynamic_axes = dynamic_axes  # Dynamo's symbolic axes; dim 0 by the settings if None
        self.built = False
        self.active = False
        self.deployed = False
        self.from_cache = False
        self.build_info: dict[str, Any] = {}
        self.judge: ArtifactJudge | None = None  # given to build(); None: nothing is judged
        self._reference: tuple[tuple[int, ...], tuple[torch.Tensor, ...]] | None = None
        # (sample, its version counters, the artifact's outputs on it) from check_artifact
        self._checked_call: CheckedCall | None = None

    # facts --------------------------------------------------------------------------------
    @classmethod
    def version(cls) -> str | None:
        """The version of the library this runtime runs on (None: nothing beyond torch); it
        keys every cached decision timed on the runtime, so an upgrade measures again."""
        return None

    @classmethod
    def layer_profiler(cls) -> LayerProfiler | None:
        """The function that times each node of an ONNX file on this runtime (None: the
        runtime has none; per-layer decisions are then timed on ONNX Runtime)."""
        return None

    @classmethod
    def rest_precision(cls) -> str | None:
        """The half type (``bf16``/``fp16``) this runtime computes an INT8 graph's unquantized
        layers in faster than in fp32 on this machine, keeping its own precision-sensitive ops
        in fp32 (:mod:`~embedl_dynamo.graph.rest_precision`); None: it has none here, and
        ``mixed`` chooses between INT8 and fp32 only."""
        return None

    def module_precisions(self) -> dict[str, str]:
        """What the built artifact computes each module's layers in, as the runtime reports
        it (module name -> ``bf16``, ``fp32``, ``int8``...); empty where it reports nothing."""
        return {}

    @classmethod
    def lint(cls, model: onnx.ModelProto) -> list[str] | None:
        """Problems this runtime's parser would have with an exported ONNX ``model``, one line
        each (None: the runtime has no lint; ``[]``: it passes)."""
        return None

    # availability -------------------------------------------------------------------------
    @classmethod
    def missing(cls) -> str | None:
        """What this machine lacks to use the runtime (None when it is usable)."""
        return None

    @classmethod
    def cuda_missing(cls) -> str | None:
        """Why this runtime cannot run a graph whose tensors are on a CUDA device (None: it
        can). A CPU engine would copy every input to host memory and every output back, and
        run the graph slower than PyTorch on the GPU: such a graph stays in PyTorch instead."""
        if cls.cuda_only:
            return None
        return f"runtime {cls.name!r} runs on the CPU only"

    @classmethod
    def is_available(cls) -> bool:
        """Whether the runtime can run here."""
        return cls.missing() is None

    @classmethod
    def require(cls) -> None:
        """Raise :class:`RuntimeUnavailableError` naming what is missing, if anything."""
        missing = cls.missing()
        if missing is not None:
            raise RuntimeUnavailableError(f"runtime {cls.name!r} is unavailable: {missing}")

    @classmethod
    def load_artifact(cls, path: Path, settings: Settings | None = None, **options: Any) -> Runtime:
        """A built, active runtime over a prebuilt artifact file (for ``embedl_dynamo.load``).

        Args:
            path: the artifact (one of :attr:`artifact_suffixes`).
            settings: the settings (threads...).
            options: runtime-specific choices (ONNX Runtime: ``providers``).
        """
        raise RuntimeUnavailableError(f"runtime {cls.name!r} does not load artifact files")

    def mark_loaded(self, artifact: Path, **info: Any) -> None:
        """Record that :meth:`load_artifact` gave this runtime a prebuilt ``artifact``, then
        activate it."""
        self.built, self.from_cache = True, True
        self.build_info = {"artifact": str(artifact), **info}
        self.activate()

    @property
    def input_names(self) -> list[str]:
        """The artifact's input names, in call order (after build or load)."""
        return []

    @property
    def output_names(self) -> list[str]:
        """The artifact's output names, in return order (after build or load)."""
        return []

    # lifecycle ----------------------------------------------------------------------------
    def build(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[torch.Tensor],
        judge: ArtifactJudge | None = None,
    ) -> Runtime:
        """Build the artifact (idempotent; runs the sample at most once) and activate.

        Args:
            gm: the transformed GraphModule (frozen weights, user inputs only); not modified.
            example_inputs: one tensor per placeholder.
            judge: the verdict on the artifact's outputs on the sample
                (:func:`~embedl_dynamo.tuning.judge.judge_artifact`); None keeps them unjudged.

        Returns:
            ``self``.
        """
        if self.built:
            return self
        self.require()
        if judge is not None:
            self.judge = judge
        try:
            self._build(gm, list(example_inputs))
        finally:
            self._reference = None
        self.built = True
        self.activate()
        return self

    def reference_outputs(
        self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """``gm``'s outputs on the sample as a tuple, computed once per build: the export
        (which needs them) and :meth:`check_artifact` share one run instead of two."""
        key = (id(gm), *map(id, example_inputs))
        if self._reference is None or self._reference[0] != key:
            self._reference = (key, graph_outputs(gm, example_inputs))
        return self._reference[1]

    def share_reference(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[torch.Tensor],
        outputs: tuple[torch.Tensor, ...],
    ) -> None:
        """Take ``gm``'s outputs on the sample from a caller that builds several runtimes of
        the same graph, so the next build does not run it again."""
        self._reference = ((id(gm), *map(id, example_inputs)), outputs)

    def check_artifact(
        self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], what: str
    ) -> None:
        """Run the built artifact once on the sample, hand its outputs to :attr:`judge` (which
        raises :class:`OutputMismatchError` to reject them) and keep them for :meth:`serve`."""
        actual = tuple(self._infer(list(example_inputs)))
        if self.judge is not None:
            reference = lambda: self.reference_outputs(gm, example_inputs)  # noqa: E731
            self.judge(gm, reference, actual, what, self.float_rtol)
        sample = tuple(example_inputs)
        self._checked_call = (sample, tuple(map(version_of, sample)), actual)

    @abstractmethod
    def _build(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        """Produce the artifact; subclasses fill ``self.build_info``."""

    def activate(self) -> None:
        """Acquire what inference needs; after it, :meth:`infer` works."""
        if not self.built:
            raise RuntimeError(f"{self.name} runtime: build() it before activate()")
        if not self.active:
            self._activate()
            self.active = True

    def deactivate(self) -> None:
        """Release inference resources; :meth:`infer` then fails until :meth:`activate`.

        Raises:
            RuntimeError: the runtime is deployed (:meth:`deploy`).
        """
        if self.deployed:
            raise RuntimeError(f"{self.name} runtime is deployed: it cannot be deactivated")
        if self.active:
            self._deactivate()
            self.active = False

    @property
    def device(self) -> torch.device:
        """The device the runtime computes on: the CPU unless a subclass says otherwise."""
        return torch.device("cpu")

    def deploy(self, device: torch.device | str | None = None) -> Runtime:
        """Pin the built runtime to its device for serving: it is active, what only building
        needed (the judge and its reference outputs) is released, and it cannot be
        deactivated any more (AITune's ``deploy``). ``load()`` and the serving replicas
        deploy what they load.

        Args:
            device: the device it must run on (None: where it is); a runtime moves to no other.

        Returns:
            ``self``.

        Raises:
            ValueError: ``device`` is not the runtime's; build or load it for that device.
        """
        if device is not None and not _same_device(torch.device(device), self.device):
            raise ValueError(
                f"{self.name} runtime runs on {self.device}, not {device}: build it there "
                "(load(path, device=...) or the compile's runtime options)"
            )
        self.activate()
        self.judge, self._reference = None, None
        self._deploy()
        self.deployed = True
        return self

    def _deploy(self) -> None:  # noqa: B027 - optional hook
        """Hook: release what only building needed."""

    def _activate(self) -> None:  # noqa: B027 - optional hook
        """Hook: acquire resources."""

    def _deactivate(self) -> None:  # noqa: B027 - optional hook
        """Hook: release resources."""

    def infer(
        self, *args: torch.Tensor, in_place: Mapping[int, int] | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Run inference on the user inputs; returns the outputs as a tuple.

        ``in_place`` maps input positions to output positions (negative: from the end) whose
        output is the input's new value, computed by an op that may write straight into the
        input (a KV cache's scatter). A runtime that can writes such an output into the
        input's own tensor and returns that tensor there, so the caller's copy of it is a
        no-op (a decode step then copies no cache); one that cannot returns a new tensor.
        """
        if not self.active:
            raise RuntimeError(f"{self.name} runtime is not active: call build() or activate()")
        if in_place:
            return self._infer_in_place(args, in_place)
        return self._infer(args)

    __call__ = infer

    def serve(self) -> Served:
        """What a compiled model calls (:class:`Served`): :meth:`infer`, except that a first
        call on the very sample :meth:`check_artifact` ran returns the outputs the check
        computed instead of running the artifact again, which shortens the first call."""
        checked, self._checked_call = self._checked_call, None
        return Served(self, checked)

    @abstractmethod
    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Hook: run inference."""

    def _infer_in_place(
        self, args: Sequence[torch.Tensor], in_place: Mapping[int, int]
    ) -> tuple[torch.Tensor, ...]:
        """Hook: run inference writing the outputs ``in_place`` names into their inputs'
        tensors (:meth:`infer`); by default nothing is written in place."""
        return self._infer(args)

    # description --------------------------------------------------------------------------
    def key(self) -> str | None:
        """The content key of the built artifact (None before build or when not cached)."""
        return self.build_info.get("key")

    def describe(self) -> str:
        """One line: runtime, whether built or loaded from the cache, and the artifact."""
        state = "cached" if self.from_cache else ("built" if self.built else "not built")
        detail = self.build_info.get("artifact") or self.build_info.get("providers") or ""
        return f"{self.name} ({state}) {detail}".rstrip()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    def to_dict(self) -> dict[str, Any]:
        """The state :meth:`from_dict` loads this runtime from: name, threads, the ``options``
        :meth:`load_artifact` recorded and the artifact ``Path`` (AITune's ``to_dict``)."""
        info = self.build_info
        artifacts = {"model": Path(info["artifact"])} if info.get("artifact") else {}
        return {
            "runtime": self.name,
            "num_threads": self.settings.num_threads,
            "options": dict(info.get("options") or {}),
            "artifacts": artifacts,
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Runtime:
        """A loaded, active runtime from :meth:`to_dict`'s state (ValueError: not its own)."""
        artifact = (state.get("artifacts") or {}).get("model")
        if state.get("runtime") != cls.name or not artifact:
            raise ValueError(f"not a {cls.name!r} state with an artifact: {dict(state)}")
        settings = Settings(num_threads=state.get("num_threads"))
        return cls.load_artifact(Path(artifact), settings, **dict(state.get("options") or {}))
