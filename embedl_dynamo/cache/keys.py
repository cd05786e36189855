"""Content keys: what decides an artifact's bytes, hashed to 64 hex characters.

:func:`content_key` hashes canonical JSON of its parts; :func:`fingerprint_graph` hashes a
graph's normalised structure and every constant it holds; :func:`library_versions` lists the
versions that change built artifacts and measured decisions; :func:`jsonable` makes data JSON the
one way the cache and the export sidecar both write it. A graph's fingerprint includes the
ambient state that changes what running it computes (autocast, the default dtype:
:mod:`~embedl_dynamo.cache.numerics`). Equal inputs give equal keys, so a warm cache is found by
content and a stale entry is never served.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

from embedl_dynamo.cache.digests import blake3_digest
from embedl_dynamo.cache.numerics import numerics_state
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.graph.rest_precision import rest_precision

__all__ = [
    "content_key",
    "cpu_identity",
    "cpu_name",
    "digests_reused",
    "fingerprint_graph",
    "is_content_key",
    "jsonable",
    "library_versions",
    "module_attributes",
    "package_version",
    "source_digest",
    "tensor_bytes",
    "version_of",
]


@functools.cache  # read from the installed files: once a process
def package_version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` that is installed (None: none)."""
    from importlib import metadata

    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def cpu_identity() -> tuple[str, str]:
    """The CPU's model name and its instruction-set flags (sorted), as the kernel lists them:
    what decides which kernels a runtime picks, so measured decisions and compiled code are
    keyed by it. Off Linux: the platform's processor name and no flags."""
    name, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    if not name:
        import platform

        name = platform.processor() or platform.machine()
    return name, flags


def cpu_name() -> str:
    """The CPU model (decisions timed on one CPU do not carry over to another)."""
    return cpu_identity()[0]


def source_digest(root: Path | None = None) -> str:
    """A digest of a package's Python sources (this package's when ``root`` is None).

    Part of :func:`library_versions`: the version number alone stays the same while an
    editable install's code changes, and an artifact the old code built would be served.
    Compilers key their caches so too (Inductor hashes its own sources).
    """
    if root is None:
        return _own_source_digest()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def _own_source_digest() -> str:
    return source_digest(Path(__file__).resolve().parents[1])


def library_versions(runtimes: Iterable[Any] = ()) -> dict[str, str | None]:
    """Versions that change built artifacts and measured decisions.

    Args:
        runtimes: the runtime classes a decision was timed on, or an artifact is built for;
            each adds its name and its declared ``version()`` (the library it runs on), so an
            upgrade of any of them measures or builds again.

    Returns:
        torch, onnx and embedl-dynamo's versions and the digest of embedl_dynamo's sources
        (:func:`source_digest`), then one entry per runtime.
    """
    versions = {
        "torch": torch.__version__,
        "onnx": package_version("onnx"),
        "embedl_dynamo": package_version("embedl-dynamo"),
        "embedl_dynamo_sources": source_digest(),
    }
    for runtime in runtimes:
        versions[f"runtime:{runtime.name}"] = runtime.version()
    return versions


# tensors at least this big are hashed on worker threads (hashlib releases the GIL)
_PARALLEL_BYTES = 1 << 20


def tensor_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's bytes as a flat uint8 numpy array (a view when it is a contiguous CPU
    tensor; a quantized tensor is dequantized first)."""
    t = tensor.detach()
    if t.is_quantized:
        t = t.dequantize()
    return t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def _header(tensor: torch.Tensor) -> str:
    """The tensor's dtype (as hashed: a quantized tensor's bytes are dequantized) and shape."""
    dtype = torch.float32 if tensor.is_quantized else tensor.dtype
    return f"{dtype}|{tuple(tensor.shape)}"


def _digest(tensor: torch.Tensor) -> bytes:
    """:data:`DIGEST` of the tensor's bytes (a CPU copy exists only while it is hashed)."""
    return blake3_digest(tensor_bytes(tensor))


# the memory a tensor views -> (a weak reference to its storage, its version, word sum, digest)
_REUSED: dict[tuple, tuple[StorageWeakRef, int, int, bytes]] = {}
_REUSED_LOCK = threading.Lock()
_PRUNE_ABOVE = [1024]  # entries whose storage was freed are dropped when the table outgrows this


@contextlib.contextmanager
def digests_reused() -> Iterator[None]:
    """Kept for callers that mark a compile: digests are reused process-wide (see
    :func:`_reused_digests`), within this block or not."""
    yield


def version_of(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter, which every in-place op bumps (None: an inference tensor,
    which keeps none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _memory_of(tensor: torch.Tensor) -> tuple | None:
    if tensor.device.type != "cpu" or tensor.is_quantized or not tensor.is_contiguous():
        return None
    if version_of(tensor) is None:
        return None
    address = tensor.untyped_storage().data_ptr()
    return (
        tensor.device,
        address,
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def _word_sum(tensor: torch.Tensor) -> int:
    """The wrapping sum of the tensor's bytes read as 64-bit words (the tail as bytes), read at
    memory speed where a cryptographic hash runs at a fraction of it; numpy reads words at any
    byte offset (a parameter that views a flat vector at an odd element)."""
    data = tensor_bytes(tensor)
    whole = data.size // 8 * 8
    total = int(data[:whole].view(np.uint64).sum(dtype=np.uint64)) if whole else 0
    return total + int(data[whole:].sum(dtype=np.uint64))


def _reused_digests(tensors: list[torch.Tensor]) -> dict[int, bytes]:
    """``id -> digest`` of the tensors whose bytes this process hashed before and that still
    hold them.

    A model is keyed before its rewrites and at its export, and each of a decoder's graphs
    (prefill, decode step, the dynamic recompile) keys the same weights again, each time through
    tensor objects of its own (the frozen graph's detached views of the parameters). A digest
    is reused for the same memory (storage, offset, sizes, strides, dtype) while the storage
    first hashed there is alive (a weak reference to the storage itself,
    ``StorageWeakRef``: its memory cannot have been freed and reused), the tensor's version
    counter, which an in-place op bumps, is the one it was hashed at, and the sum of its 64-bit
    words is unchanged: a write behind PyTorch's back (``p.data.copy_(w)``, ``p.data.mul_(2)``,
    numpy), which leaves the version as it was, changes the sum (only a write that keeps every
    word's sum, such as swapping two words, would not). A tensor without a version counter (an
    inference tensor) is hashed each time.
    """
    found = {}
    for tensor in tensors:
        memory = _memory_of(tensor)
        with _REUSED_LOCK:
            held = _REUSED.get(memory) if memory is not None else None
        if held is None or held[0].expired() or held[1] != version_of(tensor):
            continue
        if _word_sum(tensor) == held[2]:
            found[id(tensor)] = held[3]
    return found


def _remember(tensor: torch.Tensor, digest: bytes) -> None:
    memory = _memory_of(tensor)
    if memory is None:
        return
    entry = (StorageWeakRef(tensor.untyped_storage()), version_of(tensor), _word_sum(tensor))
    with _REUSED_LOCK:
        _REUSED[memory] = (*entry, digest)
        if len(_REUSED) > _PRUNE_ABOVE[0]:
            for key in [key for key, held in _REUSED.items() if held[0].expired()]:
                del _REUSED[key]
            _PRUNE_ABOVE[0] = max(1024, 2 * len(_REUSED))


def _hash_tensors(h: Any, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Add each tensor's name, dtype, shape and the digest of its bytes to ``h``, in order.

    Tensors over 1 MiB are hashed on threads, several at a time (``blake3`` releases the GIL,
    so a large model's weights hash on several cores at once); a tensor this process hashed
    before and that still holds those bytes is not hashed again (:func:`_reused_digests`).
    """
    digests = _reused_digests([t for _, t in tensors])
    reused = set(digests)
    big = [
        t
        for _, t in tensors
        if id(t) not in digests and t.numel() * t.element_size() >= _PARALLEL_BYTES
    ]
    if len(big) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            digests.update((id(t), d) for t, d in zip(big, pool.map(_digest, big)))
    for name, tensor in tensors:
        if not tensor.numel():
            h.update(f"{name}|{_header(tensor)}|empty\n".encode())
            continue
        digest = digests.get(id(tensor))
        if digest is None or id(tensor) not in reused:
            digest = digest or _digest(tensor)
            _remember(tensor, digest)
        h.update(f"{name}|{_header(tensor)}|".encode() + digest)


def fingerprint_graph(gm: fx.GraphModule) -> str:
    """sha256 over a graph's normalised structure, every constant it holds and the ambient
    state that changes its numbers.

    Covers the printed graph with literal arguments
    (:func:`~embedl_dynamo.graph.printer.format_graph`), the half type its unquantized layers
    run in when set (:mod:`~embedl_dynamo.graph.rest_precision`), every attribute of every called
    submodule and of its children (:func:`module_attributes`: a fused conv's stride, padding and
    dilation, whatever its ``repr`` shows) and the bytes, dtype and shape of every parameter,
    buffer and tensor attribute, and the ambient state that changes the graph's numbers
    (:func:`~embedl_dynamo.cache.numerics.numerics_state`: autocast, the default dtype): a
    graph compiled under ``torch.autocast`` builds another artifact than the same graph
    without, and must never be stored in its place.

    Args:
        gm: the GraphModule to fingerprint; not modified.

    Returns:
        64 lowercase hex characters.
    """
    h = hashlib.sha256()
    h.update(format_graph(gm, literals=True).encode())
    h.update(f"\nnumerics: {json.dumps(numerics_state(), sort_keys=True)}".encode())
    if rest_precision(gm) is not None:  # the same graph, another file (its metadata)
        h.update(f"\nrest precision: {rest_precision(gm)}".encode())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            for name, module in gm.get_submodule(str(node.target)).named_modules():
                h.update(f"\n{node.target}.{name}:{module_attributes(module)}".encode())
    tensors = [*gm.named_parameters(), *gm.named_buffers()]
    seen = {name for name, _ in tensors}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in seen:
            value = _fetch_attr(gm, str(node.target))
            if isinstance(value, torch.Tensor):
                seen.add(str(node.target))
                tensors.append((str(node.target), value))
            else:
                h.update(f"{node.target}={value!r}".encode())
    _hash_tensors(h, tensors)
    return h.hexdigest()


def module_attributes(module: nn.Module) -> str:
    """A module's type and every plain attribute that can change what it computes (tensors are
    hashed on their own, children described by themselves; ``_``-prefixed are PyTorch's own
    bookkeeping; ``training`` is left out: the ONNX export always runs the graph in eval mode).
    A hand-written ``extra_repr`` that omits one (a conv's stride) cannot make two modules
    share a key."""
    parts = [f"{type(module).__module__}.{type(module).__qualname__}"]
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or name == "training":
            continue
        if isinstance(value, (torch.Tensor, nn.Module)):
            continue
        parts.append(f"{name}={_attribute_text(value)}")
    return ";".join(parts)


def _attribute_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_attribute_text(v) for v in value) + ")"
    qualname = getattr(value, "__qualname__", None)
    if callable(value) and qualname is not None:
        return f"{getattr(value, '__module__', '')}.{qualname}"
    return repr(value)


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def jsonable(value: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as plain JSON data, the same way for content keys, cache and export sidecars.

    Mappings become dicts with string keys (insertion order: dump with ``sort_keys=True`` for a
    canonical text), lists, tuples and ``torch.Size`` lists, sets sorted lists, tensors and arrays
    nested lists, numpy scalars numbers, NaN and infinity the strings ``"nan"``/``"inf"``,
    dtypes, devices and paths strings.

    Args:
        value: the data.
        default: what to make of anything else (``repr`` for a report); None raises.

    Returns:
        Data :func:`json.dumps` writes as is.

    Raises:
        TypeError: a value of another type and no ``default``.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, default) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, default) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v, default) for v in value), key=repr)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return jsonable(value.item(), default)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if default is not None:
        return default(value)
    raise TypeError(
        f"{value!r} ({type(value).__name__}) is not JSON-serialisable; pass strings, numbers, "
        "lists, dicts, tensors or paths"
    )


def content_key(*parts: Any) -> str:
    """sha256 of the canonical JSON (sorted keys) of ``parts``.

    Args:
        parts: strings, numbers, lists, dicts (dtypes, devices and shapes become strings).

    Returns:
        64 lowercase hex characters.
    """
    text = json.dumps(jsonable(list(parts)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def is_content_key(value: object) -> bool:
    """Whether ``value`` is a well-formed content key (16-128 lowercase hex characters)."""
    return isinstance(value, str) and bool(re.fullmatch(r"[0-9a-f]{16,128}", value))
