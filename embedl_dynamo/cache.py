"""Content-addressed on-disk cache for built artifacts (ONNX files, engines, calibration ranges).

An entry is found by a *key*: the sha256 of everything that decides its bytes (the graph's
structure and weights from :func:`fingerprint_graph`, the input specs, the settings and the
versions of torch / onnx / onnxruntime / tensorrt, joined by :func:`content_key`). Equal inputs
give equal keys, so a second process that compiles the same model finds the artifact and builds
nothing; anything that changes the artifact changes the key, so stale entries are never served.

Safety rules, all enforced here:

* writes are atomic: a temporary file in the same directory, ``fsync``, then ``os.replace``;
* every artifact has a JSON sidecar holding its sha256 and size; an entry whose bytes do not
  match (truncated, corrupted, half-written by a killed process) is logged as a warning,
  removed and rebuilt, never trusted;
* keys must be lowercase hex and suffixes plain extensions, so no path escapes the cache root;
* a per-key ``fcntl.flock`` lock makes concurrent processes that build the same key wait for
  one builder and then read its result instead of racing;
* only bytes and JSON are stored: no pickle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import fx

__all__ = [
    "ENV_CACHE_DIR",
    "ArtifactCache",
    "atomic_write_bytes",
    "atomic_write_text",
    "content_key",
    "default_cache_dir",
    "fingerprint_graph",
    "library_versions",
    "sha256_file",
]

logger = logging.getLogger(__name__)

ENV_CACHE_DIR = "EMBEDL_DYNAMO_CACHE_DIR"

_HEX_KEY = re.compile(r"^[0-9a-f]{16,128}$")
_SUFFIX = re.compile(r"^(\.[A-Za-z0-9_]{1,16}){0,3}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def default_cache_dir() -> Path:
    """The cache root: ``$EMBEDL_DYNAMO_CACHE_DIR``, else ``$XDG_CACHE_HOME/embedl_dynamo``.

    Falls back to ``~/.cache/embedl_dynamo`` when ``XDG_CACHE_HOME`` is unset.
    """
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "embedl_dynamo"


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions that change built artifacts: torch, onnx, onnxruntime, tensorrt, embedl-dynamo."""
    return {
        "torch": torch.__version__,
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu"),
        "tensorrt": _version("tensorrt"),
        "torch_tensorrt": _version("torch-tensorrt") or _version("torch_tensorrt"),
        "embedl_dynamo": _version("embedl-dynamo"),
    }


def _hash_tensor(h: Any, name: str, tensor: torch.Tensor) -> None:
    t = tensor.detach()
    if t.is_quantized:
        t = t.dequantize()
    t = t.to("cpu").contiguous()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def fingerprint_graph(gm: fx.GraphModule) -> str:
    """sha256 over a graph's normalised structure and every constant it holds.

    Covers the printed graph with literal arguments (:func:`~.graph_printer.format_graph`), the
    repr of every called submodule (fused modules' hyper-parameters) and the bytes, dtype and
    shape of every parameter, buffer and tensor attribute.

    Args:
        gm: the GraphModule to fingerprint; not modified.

    Returns:
        64 lowercase hex characters.
    """
    from .graph_printer import format_graph

    h = hashlib.sha256()
    h.update(format_graph(gm, literals=True).encode())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            h.update(f"\n{node.target}:{gm.get_submodule(str(node.target))!r}".encode())
    seen: set[str] = set()
    for name, tensor in [*gm.named_parameters(), *gm.named_buffers()]:
        seen.add(name)
        _hash_tensor(h, name, tensor)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in seen:
            value = _fetch_attr(gm, str(node.target))
            if isinstance(value, torch.Tensor):
                seen.add(str(node.target))
                _hash_tensor(h, str(node.target), value)
            else:
                h.update(f"{node.target}={value!r}".encode())
    return h.hexdigest()


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (torch.dtype, torch.device, torch.Size, Path)):
        return str(value)
    raise TypeError(
        f"content_key part {value!r} ({type(value).__name__}) is not JSON-serialisable; "
        "pass strings, numbers, lists or dicts"
    )


def content_key(*parts: Any) -> str:
    """sha256 of the canonical JSON (sorted keys) of ``parts``.

    Args:
        parts: strings, numbers, lists, dicts (dtypes, devices and shapes become strings).

    Returns:
        64 lowercase hex characters.
    """
    text = json.dumps(_jsonable(list(parts)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ArtifactCache:
    """One namespace (``onnx``, ``calibration``, ``trt_engine``...) of the on-disk cache.

    Entries live at ``<root>/<namespace>/<key[:2]>/<key><suffix>`` with a sidecar
    ``<key><suffix>.meta.json`` holding ``sha256``, ``size`` and caller metadata.

    Args:
        root: the cache root (:func:`default_cache_dir` when None).
        namespace: a plain directory name.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, namespace: str = "artifacts"):
        if not _NAMESPACE.match(namespace):
            raise ValueError(
                f"invalid cache namespace {namespace!r}: use letters, digits, '_', '-', '.'"
            )
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.namespace = namespace
        self.dir = (self.root / namespace).resolve()

    def __repr__(self) -> str:
        return f"ArtifactCache({str(self.root)!r}, {self.namespace!r})"

    def path(self, key: str, suffix: str = "") -> Path:
        """Where the artifact for ``key`` lives; refuses keys or suffixes that could escape.

        Raises:
            ValueError: ``key`` is not 16-128 lowercase hex characters, or ``suffix`` is not a
                plain extension such as ``.onnx`` or ``.ort.onnx``.
        """
        if not isinstance(key, str) or not _HEX_KEY.match(key):
            raise ValueError(
                f"invalid cache key {key!r}: keys are 16-128 lowercase hex characters "
                "(use content_key() or fingerprint_graph())"
            )
        if not _SUFFIX.match(suffix):
            raise ValueError(f"invalid cache suffix {suffix!r}: expected e.g. '.onnx' or '.json'")
        path = (self.dir / key[:2] / f"{key}{suffix}").resolve()
        if self.dir not in path.parents:  # defence in depth; the regexes already forbid it
            raise ValueError(f"cache path {path} escapes the cache directory {self.dir}")
        return path

    @staticmethod
    def _meta_path(path: Path) -> Path:
        return path.with_name(path.name + ".meta.json")

    def _remove(self, path: Path) -> None:
        for p in (path, self._meta_path(path)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def get(self, key: str, suffix: str = "") -> Path | None:
        """The verified artifact path for ``key``, or None if absent or corrupt.

        A corrupt entry (sidecar missing or unreadable, size or sha256 mismatch) is logged as a
        warning and removed, so the caller rebuilds it.
        """
        path = self.path(key, suffix)
        meta_path = self._meta_path(path)
        if not path.exists() and not meta_path.exists():
            return None
        problem = self._verify(path, meta_path)
        if problem is None:
            return path
        logger.warning("cache entry %s is corrupt (%s); removing it and rebuilding", path, problem)
        self._remove(path)
        return None

    def metadata(self, key: str, suffix: str = "") -> dict[str, Any]:
        """The caller metadata stored with an entry by :meth:`put` (empty if none)."""
        meta_path = self._meta_path(self.path(key, suffix))
        try:
            return dict(json.loads(meta_path.read_text()).get("meta", {}))
        except (OSError, ValueError):
            return {}

    def _verify(self, path: Path, meta_path: Path) -> str | None:
        if not path.exists():
            return "artifact file missing"
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            return "checksum sidecar missing"
        except (OSError, ValueError) as exc:
            return f"checksum sidecar unreadable: {exc}"
        if not isinstance(meta, dict) or "sha256" not in meta or "size" not in meta:
            return "checksum sidecar malformed"
        size = path.stat().st_size
        if size != meta["size"]:
            return f"size {size} != recorded {meta['size']}"
        if sha256_file(path) != meta["sha256"]:
            return "sha256 mismatch"
        return None

    def put(
        self,
        key: str,
        data: bytes | str | os.PathLike[str],
        suffix: str = "",
        meta: dict[str, Any] | None = None,
    ) -> Path:
        """Store an artifact atomically and return its path.

        Args:
            key: the content key.
            data: the bytes, or the path of a finished file to move in (same filesystem is
                cheapest; it is copied otherwise).
            suffix: the file extension.
            meta: JSON-serialisable metadata kept in the sidecar.
        """
        path = self.path(key, suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, (bytes, bytearray, memoryview)):
            atomic_write_bytes(path, bytes(data))
        else:
            src = Path(data)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            try:
                try:
                    os.replace(src, tmp)
                except OSError:  # another filesystem
                    import shutil

                    shutil.copyfile(src, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        record = {"sha256": sha256_file(path), "size": path.stat().st_size, "meta": meta or {}}
        atomic_write_text(self._meta_path(path), json.dumps(_jsonable(record), sort_keys=True))
        return path

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold an exclusive per-key file lock (blocks while another process holds it)."""
        import fcntl

        lock_path = self.path(key, ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def get_or_build(
        self,
        key: str,
        build: Callable[[Path], None],
        suffix: str = "",
        meta: dict[str, Any] | None = None,
    ) -> tuple[Path, bool]:
        """Return the artifact for ``key``, building it under the key's lock if needed.

        Args:
            key: the content key.
            build: writes the artifact to the path it is given (a temporary path beside the
                final one); it runs only when no valid entry exists.
            suffix: the file extension.
            meta: metadata for the sidecar.

        Returns:
            ``(path, built)``: ``built`` is False when the entry came from the cache.
        """
        found = self.get(key, suffix)
        if found is not None:
            return found, False
        with self.lock(key):
            found = self.get(key, suffix)  # another process may have built it meanwhile
            if found is not None:
                return found, False
            final = self.path(key, suffix)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp_dir = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=final.parent))
            try:
                tmp = tmp_dir / f"artifact{suffix}"
                build(tmp)
                if not tmp.exists():
                    raise RuntimeError(f"cache builder for {key} did not write {tmp}")
                return self.put(key, tmp, suffix, meta), True
            finally:
                import shutil

                shutil.rmtree(tmp_dir, ignore_errors=True)
