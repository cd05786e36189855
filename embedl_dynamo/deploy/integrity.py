"""Whether an exported file is the one its sidecar describes: the sha256 of the files it reads.

At export the sidecar records the sha256 of the ``.onnx`` file (``onnx_sha256``), of its data
file (``onnx_data_sha256``, where the weights are stored beside it) and of a TensorRT engine
built with it (``engine_sha256``). :class:`ArtifactCheck` compares the files ``load()`` is
given with those, whatever they are called now: the file given, and every file the ONNX graph
itself reads its weights from (the ``location`` of its external-data tensors), each of which
must be a file the sidecar recorded (``onnx_data_file``) inside the model's folder. A graph
that reads another file than the one recorded (an ONNX file re-pointed at another
``weights.bin`` beside it), or one outside its folder (``../x``, an absolute path), is refused
even where its own digest was rewritten to match.

What it protects against: a file changed since export (a corrupted download or copy, a
truncated write, weights edited by a tool) and files mixed up (``a.onnx`` beside ``b.json``,
a data file of another export, a pair renamed and swapped). What it does not: someone who
changes a file on purpose can write a matching sidecar too; the sidecar is not signed.
Files are hashed on a helper thread while the runtime reads them, so the check costs little
time; a runtime that fails to read a changed file is reported as the change, not as its
own error. The ``.onnx`` file is read once for both its sha256 and its external-data
references; only a file that holds such a reference is parsed to find them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import run_in_background
from embedl_dynamo.deploy.sidecar import read_sidecar, sidecar_path

__all__ = ["ArtifactCheck", "external_data_files", "recorded_digests", "verify_artifact"]

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


# how protobuf writes an external-data entry's key (StringStringEntryProto field 1, "location"):
# a file without these bytes reads no external data, and is not parsed to find any
_LOCATION_KEY = b"\x0a\x08location"
_BLOCK = 1 << 20


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of ``graph`` and its subgraphs: initializers, sparse ones, and the
    tensors in node attributes (``Constant`` values, ``If``/``Loop`` bodies)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def external_data_files(model: Any) -> set[str]:
    """The ``location`` of every external-data tensor of the ``ModelProto`` (loaded without its
    external data), as the graph writes them: the files a runtime reads its weights from."""
    from onnx import TensorProto

    return {
        entry.value
        for tensor in _graph_tensors(model.graph)
        if tensor.data_location == TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }


def _inside(location: str) -> bool:
    """Whether ``location`` names a file in the model's folder or below it (not absolute, no
    ``..``, on either path flavour: ONNX Runtime resolves it on the host's)."""
    return all(
        not flavour(location).is_absolute()
        and not flavour(location).drive
        and ".." not in flavour(location).parts
        for flavour in (PurePosixPath, PureWindowsPath)
    ) and location.strip() not in ("", ".")


def _onnx_file(path: Path) -> tuple[str | None, set[str]]:
    """The sha256 of an ``.onnx`` file and the external-data files its graph reads, in one
    read of its bytes (parsed only where they hold an external-data reference); (None, {})
    for a missing file, and no locations for a file ONNX cannot parse (its digest says)."""
    digest, tail, marked = hashlib.sha256(), b"", False
    try:
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                digest.update(block)
                marked = marked or _LOCATION_KEY in tail + block[: len(_LOCATION_KEY)]
                marked = marked or _LOCATION_KEY in block
                tail = block[-len(_LOCATION_KEY) :]
    except FileNotFoundError:
        return None, set()
    if not marked:
        return digest.hexdigest(), set()
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - a garbage file: its digest is the verdict
        logger.debug("%s: not parsed for its external data (%s)", path.name, exc)
        return digest.hexdigest(), set()
    return digest.hexdigest(), external_data_files(model)


class ArtifactCheck:
    """The sha256 of an artifact's files against the sidecar's, hashed in the background, and
    the files its ONNX graph reads against the files the sidecar recorded.

    Args:
        path: the artifact ``load()`` was given.
        sidecar: its sidecar (:func:`~embedl_dynamo.deploy.sidecar.read_sidecar`).
    """

    def __init__(self, path: Path, sidecar: dict[str, Any]) -> None:
        self.path = path
        self.recorded = recorded_digests(path, sidecar)
        onnx_file = path.suffix.lower() == ".onnx"
        self._graph: Future[tuple[str | None, set[str]]] | None = (
            run_in_background(lambda: _onnx_file(path), "embedl-load-sha256") if onnx_file else None
        )
        self._found: dict[Path, Future[str | None]] = {
            file: run_in_background(lambda file=file: _sha256_or_none(file), "embedl-load-sha256")
            for file in self.recorded
            if file != path or self._graph is None
        }

    @property
    def verifies(self) -> bool:
        """Whether the sidecar recorded anything to check this artifact against."""
        return bool(self.recorded)

    def confirm(self) -> None:
        """Wait for the hashes; refuse a file that differs from its record, and an ONNX graph
        that reads its weights from a file outside its folder or one the sidecar did not record.

        Raises:
            ValueError: a file is missing or its bytes differ, or the graph reads another file
                than the recorded ones (the message names it and the fix).
        """
        found = {file: future.result() for file, future in self._found.items()}
        locations: set[str] = set()
        if self._graph is not None:
            found[self.path], locations = self._graph.result()
        side = sidecar_path(self.path).name
        if self.path in self.recorded:  # the file given first: a change to it explains the rest
            self._compare(self.path, found[self.path], side)
        self._check_locations(locations, side)
        for file in self.recorded:
            self._compare(file, found[file], side)

    def _check_locations(self, locations: set[str], side: str) -> None:
        for location in sorted(locations):
            if not _inside(location):
                raise ValueError(
                    f"{self.path.name} reads its weights from {location!r}, outside its own "
                    "folder; refused. Export the model again (its data file goes beside it)."
                )
            if self.verifies and self.path.parent / location not in self.recorded:
                recorded = sorted(f.name for f in self.recorded if f != self.path) or "none"
                raise ValueError(
                    f"{self.path.name} reads its weights from {location!r}, a file its sidecar "
                    f"{side} did not record at export (it records {recorded}); export the model "
                    "again, or pass check_sha256=False to load it anyway."
                )

    def _compare(self, file: Path, digest: str | None, side: str) -> None:
        if digest == self.recorded[file]:
            return
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


def verify_artifact(path: str | Path) -> None:
    """``load()``'s integrity check of ``path`` alone, without loading it: its sidecar's fields
    (:func:`~embedl_dynamo.deploy.sidecar.read_sidecar`) and :class:`ArtifactCheck`; a file
    without a sidecar is logged as unverified. For a server to refuse a changed file before
    it starts anything.

    Raises:
        ValueError: the sidecar or a file fails the check (the message names it and the fix).
    """
    path = Path(path)
    sidecar, unverified = read_sidecar(path)
    check = ArtifactCheck(path, sidecar)
    check.confirm()
    if unverified is not None or not check.verifies:
        why = unverified or "its sidecar records no sha256 of it"
        logger.warning("%s: %s; its content is not verified", path.name, why)


def _sha256_or_none(file: Path) -> str | None:
    try:
        return sha256_file(file)
    except FileNotFoundError:
        return None
