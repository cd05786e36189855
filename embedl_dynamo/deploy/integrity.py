"""Whether an exported file is the one its sidecar describes: the sha256 of its bytes.

At export the sidecar records the sha256 of the ``.onnx`` file (``onnx_sha256``), of its data
file (``onnx_data_sha256``, where the weights are stored beside it) and of a TensorRT engine
built with it (``engine_sha256``). :class:`ArtifactCheck` compares the files ``load()`` is
given with those, whatever they are called now: the file given and the data file named in the
sidecar (``onnx_data_file``; the ONNX file's own external-data references name the same file,
and the ONNX file's sha256 pins them).

What it protects against: a file changed since export (a corrupted download or copy, a
truncated write, weights edited by a tool) and files mixed up (``a.onnx`` beside ``b.json``,
a data file of another export, a pair renamed and swapped). What it does not: someone who
changes a file on purpose can write a matching sidecar too; the sidecar is not signed.
Files are hashed on a helper thread while the runtime reads them, so the check costs little
time; a runtime that fails to read a changed file is reported as the change, not as its
own error.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import run_in_background
from embedl_dynamo.deploy.sidecar import sidecar_path

__all__ = ["ArtifactCheck", "recorded_digests"]

logger = logging.getLogger(__name__)


def recorded_digests(path: Path, sidecar: dict[str, Any]) -> dict[Path, str]:
    """file -> the sha256 the sidecar recorded for it: for an ``.onnx`` file, its own and its
    data file's (when it has one); for an engine, the engine's (when one was recorded).

    Raises:
        ValueError: the sidecar names a data file outside the model's folder.
    """
    if path.suffix.lower() != ".onnx":
        digest = sidecar.get("engine_sha256")
        return {path: digest} if isinstance(digest, str) else {}
    digest = sidecar.get("onnx_sha256")
    if not isinstance(digest, str):
        return {}
    recorded = {path: digest}
    data_file, data_sha256 = sidecar.get("onnx_data_file"), sidecar.get("onnx_data_sha256")
    if data_file is not None or data_sha256 is not None:
        if not isinstance(data_file, str) or Path(data_file).name != data_file or not data_sha256:
            raise ValueError(
                f"{sidecar_path(path).name} records the data file {data_file!r}, not a file "
                f"name beside {path.name}; export the model again"
            )
        recorded[path.with_name(data_file)] = data_sha256
    return recorded


class ArtifactCheck:
    """The sha256 of an artifact's files against the sidecar's, hashed in the background.

    Args:
        path: the artifact ``load()`` was given.
        sidecar: its sidecar (:func:`~embedl_dynamo.deploy.sidecar.read_sidecar`).
    """

    def __init__(self, path: Path, sidecar: dict[str, Any]) -> None:
        self.path = path
        self.recorded = recorded_digests(path, sidecar)
        self._found: dict[Path, Future[str | None]] = {
            file: run_in_background(lambda file=file: _sha256_or_none(file), "embedl-load-sha256")
            for file in self.recorded
        }

    @property
    def verifies(self) -> bool:
        """Whether the sidecar recorded anything to check this artifact against."""
        return bool(self.recorded)

    def confirm(self) -> None:
        """Wait for the hashes; refuse a file that differs from its record.

        Raises:
            ValueError: a file is missing or its bytes differ (the message names it and the fix).
        """
        for file, found in self._found.items():
            digest = found.result()
            if digest == self.recorded[file]:
                continue
            side = sidecar_path(self.path).name
            if digest is None:
                raise ValueError(
                    f"{file.name} is missing: its sidecar {side} recorded it at export beside "
                    f"{self.path.name}. Put it back, or export the model again."
                )
            raise ValueError(
                f"{file.name} does not match the sha256 its sidecar {side} recorded at export: "
                "it was changed since, or is another export's file. Export it again, or pass "
                "check_sha256=False to load it anyway."
            )


def _sha256_or_none(file: Path) -> str | None:
    try:
        return sha256_file(file)
    except FileNotFoundError:
        return None
