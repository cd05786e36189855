"""The KServe v2 inference protocol's server side, as Triton and OpenVINO Model Server speak it.

A request is ``{"id": ..., "inputs": [{"name", "shape", "datatype", "data"}], "outputs":
[{"name"}]}`` with ``data`` the tensor's elements in row-major order (a flat list; nested lists
are accepted too); the response has the same form under ``"outputs"``. :func:`decode_inputs`
checks a request against the model's inputs and returns numpy arrays in the model's order (an
input sent as binary data arrives already read, :mod:`embedl_dynamo.serve.binary`),
:func:`response_parts` writes the outputs back, each as JSON ``data`` or, where the request asks
for binary data (:func:`requested_outputs`: Triton's ``binary_data`` and
``binary_data_output``), as bytes after the JSON; :func:`model_metadata` answers
``GET /v2/models/<name>``. The client side is :mod:`embedl_dynamo.serve.client`.

NaN and the infinities travel as Python's ``json`` writes them (``NaN``, ``Infinity``,
``-Infinity``; Python's and tritonclient's parsers read them): a float input may hold them, and
an output holding them is answered (:func:`response_bytes`), not turned into an HTTP 500.
What a datatype cannot hold is refused with HTTP 400 naming the element: ``null``, a string, a
finite number beyond the float type's range (``1e39`` as FP32), a fraction or an out-of-range
number for an integer type, a number for BOOL.

Nothing here imports Ray: the Ray Serve deployment (:mod:`embedl_dynamo.serve.ray_serve`), its
gRPC methods (:mod:`embedl_dynamo.serve.grpc_ingress`) and any client use the same functions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedl_dynamo.errors import KServeError

__all__ = [
    "DATATYPES",
    "KServeError",
    "TensorSpec",
    "decode_inputs",
    "datatype_name",
    "encode_response",
    "model_metadata",
    "requested_outputs",
    "response_bytes",
    "response_parts",
    "tensor_header",
]

# KServe v2 datatype -> numpy dtype (BF16 and BYTES have no numpy form here)
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype)
    for name, dtype in (
        ("BOOL", np.bool_),
        ("UINT8", np.uint8),
        ("UINT16", np.uint16),
        ("UINT32", np.uint32),
        ("UINT64", np.uint64),
        ("INT8", np.int8),
        ("INT16", np.int16),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
    )
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


def datatype_name(dtype: np.dtype) -> str | None:
    """The KServe v2 datatype of a numpy dtype (``float32`` -> ``FP32``); None where none is
    served here."""
    return _NAMES.get(np.dtype(dtype))


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, KServe datatype and shape (-1 where dynamic)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def tensor_header(entry: Any, index: int) -> tuple[str, list[int], str]:
    """A request input's (name, shape, datatype), each checked; its data is read apart.

    Raises:
        KServeError: the entry is no object, lacks a field, or has a shape or datatype the
            protocol (as served here) does not take.
    """
    if not isinstance(entry, Mapping):
        raise KServeError(f"inputs[{index}] must be an object with name, shape, datatype, data")
    missing = [k for k in ("name", "shape", "datatype") if k not in entry]
    if missing:
        raise KServeError(f"inputs[{index}] lacks {missing}")
    name, shape, datatype = entry["name"], entry["shape"], entry["datatype"]
    if datatype not in DATATYPES:
        raise KServeError(
            f"input {name!r}: datatype {datatype!r} is not supported; use one of "
            f"{', '.join(DATATYPES)}"
        )
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise KServeError(f"input {name!r}: shape must be a list of sizes, got {shape!r}")
    return name, shape, datatype


def _tensor(entry: Any, index: int, binary: Mapping[int, np.ndarray]) -> tuple[str, np.ndarray]:
    """One request input as (name, array), checked against its own shape and datatype; its
    elements from ``data`` or, for an input sent as binary data, from ``binary``."""
    name, shape, datatype = tensor_header(entry, index)
    if index in binary:  # read and sized by embedl_dynamo.serve.binary
        return name, binary[index]
    if "data" not in entry:
        raise KServeError(
            f"inputs[{index}] ({name!r}) has no data; send data, or binary_data_size with its "
            "bytes after the JSON header (Inference-Header-Content-Length)"
        )
    array = _values(name, entry["data"], datatype)
    if array.size != math.prod(shape):
        raise KServeError(
            f"input {name!r}: shape {shape} holds {math.prod(shape)} elements, data has "
            f"{array.size}"
        )
    return name, array.reshape(shape)


def _element(flat: np.ndarray, mask: np.ndarray) -> str:
    index = int(np.flatnonzero(mask)[0])
    return f"element {index} ({flat[index].item()!r})"


def _odd_element(values: list[Any], datatype: str, *, integers: bool) -> str | None:
    """The first element of ``values`` (Python objects) that ``datatype`` cannot hold, named;
    None when every one is a number it holds (integers: an int within its range)."""
    info = np.iinfo(DATATYPES[datatype]) if integers else None
    largest = float(np.finfo(DATATYPES[datatype]).max) if not integers else 0.0
    for index, value in enumerate(values):
        if value is None:
            return f"element {index} is null"
        if isinstance(value, bool):
            return f"element {index} is {str(value).lower()}, not a number"
        if not isinstance(value, (int, float)):
            return f"element {index} is a {type(value).__name__}, not a number"
        if info is not None and not isinstance(value, int):
            return f"element {index} ({value!r}) is not an integer"
        if info is not None and not info.min <= value <= info.max:
            return f"element {index} ({value}) is outside {datatype}'s range"
        if (
            info is None
            and abs(value) > largest
            and (isinstance(value, int) or math.isfinite(value))
        ):
            return f"element {index} ({value!r}) is outside {datatype}'s range (±{largest:.4g})"
    return None


def _problem(raw: np.ndarray, data: Any, datatype: str) -> str | None:
    """Why ``raw`` (numpy's reading of the JSON ``data``) is not ``datatype``'s values."""
    kind, given, flat = DATATYPES[datatype].kind, raw.dtype.kind, raw.reshape(-1)
    everything = np.ones(flat.shape, bool)
    if kind == "b":
        return (
            None
            if given == "b" or not flat.size
            else f"{_element(flat, everything)} is not true or false"
        )
    if given == "b" and flat.size:
        return f"{_element(flat, everything)} is true or false, not a number"
    if kind in "iu" and given in "iu":
        info = np.iinfo(DATATYPES[datatype])
        outside = (flat < info.min) | (flat > info.max)
        return f"{_element(flat, outside)} is outside {datatype}'s range" if outside.any() else None
    if kind in "iu" or given not in "iuf":  # exactly, on Python's numbers (floats lose digits)
        values = np.asarray(data, dtype=object).reshape(-1).tolist()
        problem = _odd_element(values, datatype, integers=kind in "iu")
        return problem if problem or kind in "iu" else "its elements are not numbers of one kind"
    largest = float(np.finfo(DATATYPES[datatype]).max)
    values = flat.astype(np.float64)
    outside = np.isfinite(values) & (np.abs(values) > largest)
    if outside.any():
        return f"{_element(flat, outside)} is outside {datatype}'s range (±{largest:.4g})"
    return None


def _values(name: str, data: Any, datatype: str) -> np.ndarray:
    """``data`` as an array of ``datatype``; what the type cannot hold is refused, not
    converted (numpy would read null as NaN, "1" as 1, 1.5 as 1 and 1e39 as FP32's inf)."""
    try:
        raw = np.asarray(data)
    except (TypeError, ValueError, RecursionError) as exc:  # ragged nesting
        raise KServeError(f"input {name!r}: data is not nested lists of one shape ({exc})") from exc
    problem = _problem(raw, data, datatype)
    if problem is not None:
        raise KServeError(f"input {name!r}: {problem}; send {datatype} values")
    dtype = DATATYPES[datatype]
    if raw.dtype.kind not in "biuf" or (dtype.kind in "iu" and raw.dtype.kind == "f"):
        raw = np.asarray(data, dtype=object)  # Python's ints, exact (numpy made them floats)
    return raw.astype(dtype)


def decode_inputs(
    body: Any, inputs: Sequence[TensorSpec], binary: Mapping[int, np.ndarray] | None = None
) -> list[np.ndarray]:
    """The request's input arrays in the model's input order.

    Args:
        body: the request's JSON (its header, for a request with binary data).
        inputs: the model's inputs.
        binary: the arrays of the inputs sent as binary data, by their index in
            ``body["inputs"]`` (:func:`embedl_dynamo.serve.binary.read_request`).

    Raises:
        KServeError: a malformed request, a missing or unknown input, or an input whose
            datatype, rank or static size differs from the model's.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("inputs"), list):
        raise KServeError('a KServe v2 request is a JSON object with an "inputs" list')
    given = dict(_tensor(entry, i, binary or {}) for i, entry in enumerate(body["inputs"]))
    names = [spec.name for spec in inputs]
    unknown, missing = sorted(set(given) - set(names)), [n for n in names if n not in given]
    if unknown or missing:
        raise KServeError(f"the model's inputs are {names}; missing {missing}, unknown {unknown}")
    arrays = []
    for spec in inputs:
        array = given[spec.name]
        if _NAMES[array.dtype] != spec.datatype:
            raise KServeError(
                f"input {spec.name!r} is {spec.datatype}, got {_NAMES[array.dtype]}; send it as "
                f"{spec.datatype}"
            )
        fits = array.ndim == len(spec.shape) and all(
            want in (-1, got) for want, got in zip(spec.shape, array.shape)
        )
        if not fits:
            raise KServeError(
                f"input {spec.name!r} has shape {list(spec.shape)} (-1: any size), got "
                f"{list(array.shape)}"
            )
        arrays.append(array)
    return arrays


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise KServeError(f"{what} must be true or false, got {value!r}")
    return value


def requested_outputs(
    body: Mapping[str, Any] | None, outputs: Sequence[TensorSpec]
) -> list[tuple[int, bool]]:
    """Which of the model's ``outputs`` to answer, in the model's order, and whether each goes
    as binary data: an output's ``parameters.binary_data`` where the request names it, else the
    request's ``parameters.binary_data_output`` (default false: JSON), as Triton reads them.

    Raises:
        KServeError: an unknown output, a malformed entry, or an extension not served here
            (classification, shared memory).
    """
    body = body or {}
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise KServeError(f'the request\'s "parameters" must be an object, got {parameters!r}')
    default = _flag(parameters.get("binary_data_output", False), "binary_data_output")
    names = [spec.name for spec in outputs]
    asked: dict[str, bool] = {}
    for entry in body.get("outputs") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise KServeError(f'each of "outputs" must be an object with a name, got {entry!r}')
        extra = entry.get("parameters") or {}
        unserved = sorted({"classification", "shared_memory_region"} & set(extra))
        if unserved:
            raise KServeError(
                f"output {entry['name']!r}: {unserved[0]} is not served here; ask for the "
                "tensor itself"
            )
        asked[entry["name"]] = _flag(extra.get("binary_data", default), "binary_data")
    unknown = sorted(set(asked) - set(names))
    if unknown:
        raise KServeError(f"unknown outputs {unknown}; the model's outputs are {names}")
    if not asked:
        return [(i, default) for i in range(len(outputs))]
    return [(i, asked[name]) for i, name in enumerate(names) if name in asked]


def response_parts(
    model_name: str,
    outputs: Sequence[TensorSpec],
    arrays: Sequence[np.ndarray],
    body: Mapping[str, Any] | None = None,
    *,
    binary: bool = True,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The response's JSON and the arrays that follow it as binary data, in that order.

    An output asked for as binary data (:func:`requested_outputs`) is described with
    ``parameters.binary_data_size`` and no ``data``; ``binary=False`` writes every output as
    JSON ``data``. The request's ``id`` is answered.
    """
    tensors, raw = [], []
    for index, as_binary in requested_outputs(body, outputs):
        array = np.asarray(arrays[index])
        entry: dict[str, Any] = {
            "name": outputs[index].name,
            "datatype": _NAMES[array.dtype],
            "shape": list(array.shape),
        }
        if as_binary and binary:
            entry["parameters"] = {"binary_data_size": array.nbytes}
            raw.append(array)
        else:
            entry["data"] = array.ravel().tolist()
        tensors.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if body and "id" in body:
        response["id"] = body["id"]
    return response, raw


def encode_response(
    model_name: str,
    outputs: Sequence[TensorSpec],
    arrays: Sequence[np.ndarray],
    body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The response as JSON alone: every output (or those the request's ``outputs`` names)
    with its ``data``."""
    return response_parts(model_name, outputs, arrays, body, binary=False)[0]


def model_metadata(
    name: str, platform: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> dict[str, Any]:
    """``GET /v2/models/<name>``: name, versions, platform, inputs and outputs."""
    return {
        "name": name,
        "versions": ["1"],
        "platform": platform,
        "inputs": [spec.to_dict() for spec in inputs],
        "outputs": [spec.to_dict() for spec in outputs],
    }


def response_bytes(content: Any) -> bytes:
    """A response body as Python's ``json`` writes it: NaN and the infinities as ``NaN``,
    ``Infinity`` and ``-Infinity`` (where a strict encoder, as FastAPI's, fails with a 500)."""
    return json.dumps(content, separators=(",", ":")).encode()
