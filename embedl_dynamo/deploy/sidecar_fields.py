"""The fields of an export sidecar that ``load()``, serving and Triton act on, checked and bounded.

A sidecar (``model.json``) is a file anyone can edit, and what it says is acted on: the threads
a runtime starts, the files hashed and read, the output structure rebuilt, the batch a Triton
config allows. :func:`check_fields` checks each such field as :func:`~embedl_dynamo.load`'s own
arguments are checked (``runtime.num_threads`` within :func:`max_threads`, as
``load(num_threads=...)``), so an edited sidecar is refused with the field and the fix named
instead of hanging a replica (``"num_threads": 100000``) or pointing a check at another file.
Fields only people read (the plan, the report, the timings, the versions) are not acted on and
not checked. :func:`~embedl_dynamo.deploy.sidecar.read_sidecar`, the one reader, calls it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from embedl_dynamo.graph.output_tree import OutputTree

__all__ = ["MAX_SIDECAR_BYTES", "check_fields", "check_threads", "max_threads"]

#: a sidecar larger than this is refused unread (export writes kilobytes to a few megabytes)
MAX_SIDECAR_BYTES = 64 * 2**20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_RANK = 64


def max_threads() -> int:
    """The most intra-op threads a runtime is given: 4 per CPU here, at least 64 (beyond that
    a runtime only contends with itself, and 100,000 threads take minutes to start)."""
    return max(64, 4 * (os.cpu_count() or 1))


def check_threads(value: Any, name: str = "num_threads") -> None:
    """Refuse a thread count that is not None or an integer from 1 to :func:`max_threads`.

    Raises:
        ValueError: naming ``name``, the value and the valid range.
    """
    if value is None:
        return
    limit = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(f"invalid {name}={value!r}; expected None or an integer from 1 to {limit}")


def _file_name(value: Any) -> bool:
    """Whether ``value`` is a plain file name (no folder, not ``.`` or ``..``)."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and PurePath(value).name == value
        and "/" not in value
        and "\\" not in value
    )


def _specs(value: Any) -> str | None:
    """Why ``value`` is not a list of input or output specs (None: it is)."""
    if not isinstance(value, list):
        return "is not a list"
    for index, spec in enumerate(value):
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            return f"[{index}] is not an object with a name"
        shape, dtype = spec.get("shape"), spec.get("dtype")
        if not isinstance(shape, list) or len(shape) > _MAX_RANK:
            return f"[{index}] has no shape list of at most {_MAX_RANK} axes"
        if not all(isinstance(d, str) or (type(d) is int and d >= 0) for d in shape):
            return f"[{index}] has an axis that is neither a size >= 0 nor a name"
        if not isinstance(dtype, str):
            return f"[{index}] has no dtype"
    return None


def _runtime(value: Any) -> str | None:
    """Why the ``runtime`` record is not one :meth:`Runtime.to_dict` writes (None: it is)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("runtime"), str):
        return "is not an object naming a runtime"
    try:
        check_threads(value.get("num_threads"), "runtime.num_threads")
    except ValueError as exc:
        return f"holds an {exc}"
    options = value.get("options")
    if options is not None and not (
        isinstance(options, Mapping) and all(isinstance(k, str) for k in options)
    ):
        return "has options that are not an object"
    return None


def _output_tree(value: Any) -> str | None:
    try:
        OutputTree.from_dict(value)
    except ValueError as exc:
        return f"is {exc}"
    return None


def _settings(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "is not an object"
    batch = value.get("max_batch")
    if batch is not None and (type(batch) is not int or batch < 1):
        return f"has max_batch={batch!r}, not an integer >= 1"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _guards(value: Any) -> str | None:
    """Why ``guards`` is not what export writes: the index flag's output and ops, and per
    runtime why NaN and infinite inputs are refused (None: they are not)."""
    if not isinstance(value, Mapping):
        return "is not an object"
    flag = value.get("index_out_of_range")
    if flag is not None and not (
        isinstance(flag, Mapping)
        and isinstance(flag.get("output"), str)
        and _strings(flag.get("ops"))
    ):
        return "has an index_out_of_range that is not an output name and a list of ops"
    finite = value.get("non_finite_inputs")
    if finite is not None and not (
        isinstance(finite, Mapping)
        and all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in finite.items())
    ):
        return "has non_finite_inputs that do not map runtimes to a reason or null"
    return None


def _named(value: Any) -> str | None:
    ok = isinstance(value, Mapping) and isinstance(value.get("name"), str)
    return None if ok else "is not an object with a name"


def _digest(value: Any) -> str | None:
    ok = isinstance(value, str) and _SHA256.match(value)
    return None if ok else "is not a sha256 (64 lowercase hex digits)"


def _name(value: Any) -> str | None:
    return None if _file_name(value) else "is not a file name beside the model (no folder)"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "is not a string"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "is not true or false"


# field -> why its value is wrong (None: right); a field set to null is absent
_RULES = {
    "onnx_file": _name,
    "onnx_sha256": _digest,
    "onnx_data_file": _name,
    "onnx_data_sha256": _digest,
    "engine_file": _name,
    "engine_sha256": _digest,
    "backend": _named,
    "runtime": _runtime,
    "inputs": _specs,
    "outputs": _specs,
    "output_tree": _output_tree,
    "precision": _text,
    "quantized": _flag,
    "settings": _settings,
    "guards": _guards,
}


def check_fields(sidecar: Mapping[str, Any], side: str) -> None:
    """Refuse a sidecar whose fields that are acted on are not what export writes.

    Args:
        sidecar: the parsed sidecar (its ``format`` already checked).
        side: its file name, for the message.

    Raises:
        ValueError: the first bad field, its value's problem, and the fix.
    """
    for field, rule in _RULES.items():
        value = sidecar.get(field)
        problem = None if value is None else rule(value)
        if problem is not None:
            raise ValueError(
                f"{side}: its field {field!r} {problem}; fix or remove the field, or export the "
                "model again"
            )
