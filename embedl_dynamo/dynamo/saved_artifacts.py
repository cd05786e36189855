"""Which cache entries a saved compiled function loads, their digests, and the bundle that
ships them beside the saved file.

A saved function names its artifacts by content key and BLAKE3 digest, never by path
(:func:`artifact_records`): the ONNX artifact of the graph, or of each runtime fragment of a
partitioned graph, and for a graph PyTorch beat the runtimes on, that decision. When it loads,
each artifact must be in the cache it reads, with the digest it was saved with
(:func:`artifacts_problem`); the cache verifies the file's bytes against that digest as it
reads them. After the load, each graph must have loaded the very artifact it was saved with
(:func:`restore_problems`).

A bundle (:func:`write_bundle`) is a cache directory holding only these entries: the
artifacts, their sidecars and companions, the warm-start aliases that name them (found by the
artifact each names, or for PyTorch's decision by its measured times), and what the cache
derived from them (OpenVINO's compiled model, ONNX Runtime's optimised graph: keyed by the
runtime's version and the CPU, so a start elsewhere makes its own). Loading with it reads
nothing else, so the file and its bundle can be shipped where no cache was built.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embedl_dynamo.cache.checksums import sidecar_path
from embedl_dynamo.cache.companion import companion_path
from embedl_dynamo.cache.files import claim_cache_root
from embedl_dynamo.cache.store import DERIVED_FROM, ArtifactCache
from embedl_dynamo.report.subgraph import SubgraphReport
from embedl_dynamo.runtimes.registry import runtime_classes

__all__ = ["artifact_records", "artifacts_problem", "restore_problems", "write_bundle"]

logger = logging.getLogger(__name__)

_ONNX = ("onnx", ".onnx")
_ALIAS = ("subgraph", ".json")


def _parts(report: SubgraphReport) -> Iterator[tuple[str, SubgraphReport]]:
    """The graph's report, or each fragment's for a partitioned graph, with its label."""
    if report.partitions:
        for part in report.partitions:
            yield f"fragment {part.partition}", part
    else:
        yield "graph", report


def artifact_records(report: SubgraphReport, cache_dir: Path) -> list[dict[str, Any]]:
    """What each part of the compiled graph loads: ``{"part", "runtime", "key", "digest"}``
    for an ONNX artifact, ``{"part", "runtime": "eager", "eager_speed"}`` for PyTorch's win.
    Parts that run in PyTorch for another reason load nothing."""
    classes = runtime_classes()
    records = []
    for label, part in _parts(report):
        key = part.runtime_info.get("key")
        cls = classes.get(part.runtime)
        if key and cls is not None and cls.cpu_target is not None:
            digest = ArtifactCache(cache_dir, _ONNX[0]).recorded_digest(key, _ONNX[1])
            records.append({"part": label, "runtime": part.runtime, "key": key, "digest": digest})
        elif part.status == "eager" and "eager_speed" in part.pipeline:
            speed = part.pipeline["eager_speed"]
            records.append({"part": label, "runtime": "eager", "eager_speed": speed})
    return records


def artifacts_problem(records: list[dict[str, Any]], cache_dir: Path) -> str | None:
    """Why the cache at ``cache_dir`` cannot give the saved artifacts (missing, or another
    digest than saved), naming the fix; None when it holds every one."""
    cache = ArtifactCache(cache_dir, _ONNX[0])
    for record in records:
        if "key" not in record:
            continue
        digest = cache.recorded_digest(record["key"], _ONNX[1])
        where = f"the {record['part']}'s {record['runtime']} artifact {record['key'][:16]}"
        if digest is None:
            return (
                f"{where} is not in the cache at {cache_dir}: load where the cache that saved it "
                "is (EMBEDL_DYNAMO_CACHE_DIR or cache_dir=), or save with bundle=True and ship "
                "the bundle beside the file"
            )
        if digest != record["digest"]:
            return (
                f"{where} in the cache at {cache_dir} holds other bytes than the saved one "
                f"(digest {digest[:16]}, saved {str(record['digest'])[:16]}): save it again"
            )
    return None


def restore_problems(
    records: list[dict[str, Any]], report: SubgraphReport | None
) -> tuple[list[str], list[str]]:
    """Errors (a part loaded another artifact than saved) and warnings (a part was built
    again, not loaded) after the saved graph was compiled again on a load."""
    if report is None:
        return [], []
    parts = dict(_parts(report))
    errors, warnings = [], []
    for record in records:
        part = parts.get(record["part"])
        if part is None:
            errors.append(f"the {record['part']} it was saved with is not in the graph loaded")
        elif not part.loaded:
            warnings.append(
                f"the {record['part']} was built again ({part.compile_s:.1f} s), not loaded: "
                "the cache holds no warm start for it under this package's, torch's or onnx's "
                "versions"
            )
        elif "key" in record and part.runtime_info.get("key") != record["key"]:
            errors.append(
                f"the {record['part']} loaded artifact {str(part.runtime_info.get('key'))[:16]}, "
                f"not the saved {record['key'][:16]}: the cache's warm-start entry names "
                "another artifact; save it again"
            )
    return errors, warnings


def write_bundle(records: list[dict[str, Any]], cache_dir: Path, bundle: Path) -> None:
    """Copy the saved artifacts and the aliases that name them from ``cache_dir`` into the
    cache directory ``bundle`` (created, or one already marked as a cache).

    Raises:
        FileNotFoundError: an artifact is not in ``cache_dir`` any more.
        NotACacheError: ``bundle`` holds other files.
    """
    claim_cache_root(bundle)
    keys = {r["key"] for r in records if "key" in r}
    speeds = [r["eager_speed"] for r in records if "eager_speed" in r]
    source = ArtifactCache(cache_dir, _ONNX[0])
    for key in sorted(keys):
        path = source.path(key, _ONNX[1])
        if not path.is_file():
            raise FileNotFoundError(f"artifact {key[:16]} is not in the cache at {cache_dir}")
        _copy_entry(path, cache_dir, bundle)
    digests = {source.recorded_digest(key, _ONNX[1]) for key in keys} - {None}
    for path in [*_aliases(cache_dir, keys, speeds), *_derived(cache_dir, digests)]:
        _copy_entry(path, cache_dir, bundle)


def _derived(cache_dir: Path, digests: set[str]) -> Iterator[Path]:
    """The entries in ``cache_dir`` derived from an artifact of one of ``digests`` (none read
    through a link)."""
    for sidecar in sorted(cache_dir.glob("*/*/*.meta.json")):
        if sidecar.parent.is_symlink() or sidecar.parent.parent.is_symlink():
            continue
        try:
            meta = json.loads(sidecar.read_text()).get("meta") or {}
        except (OSError, ValueError, AttributeError):
            continue
        entry = sidecar.with_name(sidecar.name.removesuffix(".meta.json"))
        if meta.get(DERIVED_FROM) in digests and entry.is_file() and not entry.is_symlink():
            yield entry


def _aliases(cache_dir: Path, keys: set[str], speeds: list[Any]) -> Iterator[Path]:
    """The warm-start aliases in ``cache_dir`` that name one of ``keys`` or a PyTorch
    decision with one of ``speeds``."""
    folder = ArtifactCache(cache_dir, _ALIAS[0]).dir
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(f"*/*{_ALIAS[1]}")):
        if path.name.endswith(".meta.json") or path.is_symlink():
            continue
        try:
            alias = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(alias, dict):
            continue
        speed = (alias.get("pipeline") or {}).get("eager_speed")
        if alias.get("onnx_key") in keys or (speed is not None and speed in speeds):
            yield path


def _copy_entry(path: Path, root: Path, bundle: Path) -> None:
    """Copy an entry, its sidecar and companion to the same place under ``bundle``."""
    relative = path.resolve().relative_to(root.resolve())
    for source in (path, sidecar_path(path), companion_path(path)):
        if not source.is_file():
            continue
        target = bundle / relative.parent / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=source.name)
        os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    logger.debug("bundled %s", relative)
