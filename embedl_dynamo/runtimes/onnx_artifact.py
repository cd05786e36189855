"""The base of the runtimes that run the graph's ONNX artifact (ONNX Runtime, OpenVINO)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import fx

from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.artifact import OnnxArtifact, cached_onnx, onnx_artifact
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
        self._confirm: Callable[[], None] | None = None  # the cached file's pending sha256

    def use_cached(self, key: str) -> bool:
        """Build from the cached ONNX artifact ``key`` instead of exporting; False if absent.

        ``build(gm, ...)`` then only checks the artifact's outputs against ``gm``, which may be
        the untransformed graph (same function, so the check still holds). The file's sha256
        is computed while the runtime reads it, and confirmed before that check
        (:class:`~embedl_dynamo.errors.CorruptEntryError` if it does not match).
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
        confirm, self._confirm = self._confirm, None
        if confirm is not None:
            confirm()
        super().check_artifact(gm, example_inputs, what)

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
