"""The base of the runtimes that run the graph's ONNX artifact (ONNX Runtime, OpenVINO)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import fx

from embedl_dynamo.cache.checksums import PendingChecksum
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact, cached_onnx, onnx_artifact, recorded_digest
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.settings import Settings

__all__ = ["OnnxArtifactRuntime"]


class OnnxArtifactRuntime(Runtime):
    """A runtime that runs the cached ONNX artifact (ONNX Runtime, OpenVINO)."""

    def __init__(
        self, settings: Settings | None = None, dynamic_axes: DynamicAxes | None = None
    ) -> None:
        super().__init__(settings, dynamic_axes)
        self._prebuilt: OnnxArtifact | None = None
        self._artifact: OnnxArtifact | None = None  # what the runtime runs
        self._confirm: PendingChecksum | None = None  # the cached file's checksum, to confirm

    def use_cached(self, key: str) -> bool:
        """Build from the cached ONNX artifact ``key`` instead of exporting; False if absent.

        ``build(gm, ...)`` then only checks the artifact's outputs against ``gm``, which may be
        the untransformed graph (same function, so the check still holds). The file's checksum
        is computed while the runtime reads it (from :meth:`read_artifact`), and confirmed
        before that check (:class:`~embedl_dynamo.errors.CorruptEntryError` if it does not
        match).
        """
        found = cached_onnx(key, self.settings)
        if found is None:
            return False
        path, self._confirm = found
        self._prebuilt = OnnxArtifact(key, False, path)
        return True

    def check_artifact(
        self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], what: str
    ) -> None:
        """Confirm a cached artifact's checksum, then :meth:`Runtime.check_artifact`."""
        self.confirm_artifact()
        super().check_artifact(gm, example_inputs, what)

    def confirm_artifact(self) -> None:
        """Confirm a cached artifact's checksum now, once (raises
        :class:`~embedl_dynamo.errors.CorruptEntryError` if it does not match)."""
        confirm, self._confirm = self._confirm, None
        if confirm is not None:
            confirm()

    def artifact_problem(self) -> Callable[[], str | None] | None:
        """For a file derived from a cached artifact on a helper thread: waits for the
        artifact's checksum and returns the problem found, or None, removing nothing (the
        runtime's own :meth:`confirm_artifact` acts on it). None: nothing to wait for (a file
        this process wrote)."""
        return self._confirm.problem if self._confirm is not None else None

    def artifact_digest(self) -> str | None:
        """The digest the artifact's file is recorded with in the cache (None: not a cached
        file), which the files a runtime derives from it are keyed by."""
        key = self._artifact.key if self._artifact is not None else None
        return recorded_digest(key, self.settings) if key else None

    def read_artifact(self) -> Path:
        """The artifact's file, for a runtime about to read it: a cached file's checksum starts
        now, on a helper thread."""
        if self._confirm is not None:
            self._confirm.start()
        assert self._artifact is not None
        return self._artifact.path

    def artifact_not_read(self) -> None:
        """The runtime runs a file derived from the artifact, whose checksum it confirmed
        itself, and never read the artifact: the artifact's checksum is not computed."""
        self._confirm = None

    @classmethod
    def builds_from_memory(cls) -> bool:
        """Whether this runtime builds from a fresh export in memory
        (:attr:`OnnxArtifact.unwritten`) rather than waiting for its file."""
        return False

    def use_artifact(self, artifact: OnnxArtifact) -> None:
        """Build from the ONNX artifact :func:`onnx_artifact` just returned for this very
        graph: it is neither fingerprinted nor verified again."""
        self._prebuilt = artifact

    def artifact(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> OnnxArtifact:
        """The ONNX artifact to run (the prebuilt one, or the cached export of ``gm``); it
        becomes the one the runtime runs, and sets :attr:`from_cache`."""
        artifact = self._prebuilt
        if artifact is None:
            artifact = onnx_artifact(
                gm,
                example_inputs,
                self.settings,
                self.dynamic_axes,
                reference=lambda: self.reference_outputs(gm, example_inputs),
                in_memory=self.builds_from_memory(),
            )
        self.from_cache = not artifact.built
        self._artifact = artifact
        return artifact
