"""Content keys: what decides an artifact's bytes, hashed to 64 hex characters.

:func:`content_key` hashes canonical JSON of its parts; :func:`fingerprint_graph` hashes a
graph's normalised structure and every constant it holds; :func:`library_versions` lists the
versions that change built artifacts and measured decisions. Equal inputs give equal keys, so a warm cache is found by
content and a stale entry is never served.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import fx

from embedl_dynamo.graph.printer import format_graph

__all__ = [
    "content_key",
    "fingerprint_graph",
    "is_content_key",
    "jsonable",
    "library_versions",
    "sha256_file",
    "tensor_bytes",
]


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def library_versions(runtimes: Iterable[Any] = ()) -> dict[str, str | None]:
    """Versions that change built artifacts and measured decisions.

    Args:
        runtimes: the runtime classes a decision was timed on, or an artifact is built for;
            each adds its name and its declared ``version()`` (the library it runs on), so an
            upgrade of any of them measures or builds again.

    Returns:
        torch, onnx and embedl-dynamo's versions, then one entry per runtime.
    """
    versions = {
        "torch": torch.__version__,
        "onnx": _version("onnx"),
        "embedl_dynamo": _version("embedl-dynamo"),
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
    """sha256 of the tensor's bytes (a CPU copy exists only while it is hashed)."""
    return hashlib.sha256(tensor_bytes(tensor)).digest()


def _hash_tensors(h: Any, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Add each tensor's name, dtype, shape and the sha256 of its bytes to ``h``, in order.

    Tensors over 1 MiB are hashed two at a time on threads (BERT-base's 440 MB of weights
    in half the time on two cores).
    """
    big = [t for _, t in tensors if t.numel() * t.element_size() >= _PARALLEL_BYTES]
    digests: dict[int, bytes] = {}
    if len(big) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            digests = {id(t): d for t, d in zip(big, pool.map(_digest, big))}
    for name, tensor in tensors:
        if not tensor.numel():
            h.update(f"{name}|{_header(tensor)}|empty\n".encode())
            continue
        digest = digests.get(id(tensor)) or _digest(tensor)
        h.update(f"{name}|{_header(tensor)}|".encode() + digest)


def fingerprint_graph(gm: fx.GraphModule) -> str:
    """sha256 over a graph's normalised structure and every constant it holds.

    Covers the printed graph with literal arguments (:func:`~embedl_dynamo.graph.printer.format_graph`), the
    repr of every called submodule (fused modules' hyper-parameters) and the bytes, dtype and
    shape of every parameter, buffer and tensor attribute.

    Args:
        gm: the GraphModule to fingerprint; not modified.

    Returns:
        64 lowercase hex characters.
    """
    h = hashlib.sha256()
    h.update(format_graph(gm, literals=True).encode())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            h.update(f"\n{node.target}:{gm.get_submodule(str(node.target))!r}".encode())
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


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
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
    text = json.dumps(jsonable(list(parts)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_content_key(value: object) -> bool:
    """Whether ``value`` is a well-formed content key (16-128 lowercase hex characters)."""
    return isinstance(value, str) and bool(re.fullmatch(r"[0-9a-f]{16,128}", value))
