"""The KServe v2 inference protocol's JSON form, as Triton and OpenVINO Model Server speak it.

A request is ``{"id": ..., "inputs": [{"name", "shape", "datatype", "data"}], "outputs":
[{"name"}]}`` with ``data`` the tensor's elements in row-major order (a flat list; nested lists
are accepted too); the response has the same form under ``"outputs"``. :func:`decode_inputs`
checks a request against the model's inputs and returns numpy arrays in the model's order,
:func:`encode_response` writes the outputs back, :func:`model_metadata` answers
``GET /v2/models/<name>``. :func:`infer_request` and :func:`post_infer` are the client side
(the request body, and an HTTP POST that retries an idempotent request on a connection error or
a 502/503/500 from a replica that died mid-request, never a 4xx, nor a 500 the server marked
``"retry": false``: the model's own failure, which another try would repeat).

NaN and the infinities travel as Python's ``json`` writes them (``NaN``, ``Infinity``,
``-Infinity``; Python's and tritonclient's parsers read them): a float input may hold them, and
an output holding them is answered (:func:`response_bytes`), not turned into an HTTP 500.
What a datatype cannot hold is refused with HTTP 400 naming the element: ``null``, a string, a
finite number beyond the float type's range (``1e39`` as FP32), a fraction or an out-of-range
number for an integer type, a number for BOOL.

Nothing here imports Ray: the Ray Serve deployment (:mod:`embedl_dynamo.serve.ray_serve`) and
any client use the same functions.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
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
    "decode_outputs",
    "encode_response",
    "infer_request",
    "model_metadata",
    "post_infer",
    "response_bytes",
]

logger = logging.getLogger(__name__)

# KServe v2 datatype -> numpy dtype (BF16 and BYTES have no numpy form here)
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype)
    for name, dtype in (
        ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
        ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
        ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    )
}  # fmt: skip
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
RETRY_STATUS = (500, 502, 503, 504)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, KServe datatype and shape (-1 where dynamic)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _tensor(entry: Any, index: int) -> tuple[str, np.ndarray]:
    """One request input as (name, array), checked against its own shape and datatype."""
    if not isinstance(entry, Mapping):
        raise KServeError(f"inputs[{index}] must be an object with name, shape, datatype, data")
    missing = [k for k in ("name", "shape", "datatype", "data") if k not in entry]
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


def decode_inputs(body: Any, inputs: Sequence[TensorSpec]) -> list[np.ndarray]:
    """The request's input arrays in the model's input order.

    Raises:
        KServeError: a malformed request, a missing or unknown input, or an input whose
            datatype, rank or static size differs from the model's.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("inputs"), list):
        raise KServeError('a KServe v2 request is a JSON object with an "inputs" list')
    given = dict(_tensor(entry, i) for i, entry in enumerate(body["inputs"]))
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


def encode_response(
    model_name: str,
    outputs: Sequence[TensorSpec],
    arrays: Sequence[np.ndarray],
    body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The response: every output (or those the request's ``outputs`` names) as JSON."""
    wanted = [o.get("name") for o in (body or {}).get("outputs") or [] if isinstance(o, Mapping)]
    unknown = sorted(set(wanted) - {spec.name for spec in outputs})
    if unknown:
        raise KServeError(f"unknown outputs {unknown}; the model's outputs are "
                          f"{[spec.name for spec in outputs]}")  # fmt: skip
    tensors = []
    for spec, array in zip(outputs, arrays):
        if wanted and spec.name not in wanted:
            continue
        array = np.asarray(array)
        tensors.append({"name": spec.name, "datatype": _NAMES[array.dtype],
                        "shape": list(array.shape), "data": array.ravel().tolist()})  # fmt: skip
    response: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if body and "id" in body:
        response["id"] = body["id"]
    return response


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


def infer_request(
    arrays: Sequence[np.ndarray], names: Sequence[str], request_id: str | None = None
) -> dict[str, Any]:
    """A KServe v2 JSON request body for ``arrays`` (flat row-major data)."""
    inputs = []
    for name, array in zip(names, arrays, strict=True):
        array = np.asarray(array)
        if array.dtype not in _NAMES:
            raise KServeError(f"input {name!r}: dtype {array.dtype} has no KServe datatype")
        inputs.append({"name": name, "shape": list(array.shape), "datatype": _NAMES[array.dtype],
                       "data": array.ravel().tolist()})  # fmt: skip
    body: dict[str, Any] = {"inputs": inputs}
    if request_id is not None:
        body["id"] = request_id
    return body


def decode_outputs(response: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A response's outputs as ``{name: array}``."""
    return {
        o["name"]: np.asarray(o["data"], dtype=DATATYPES[o["datatype"]]).reshape(o["shape"])
        for o in response["outputs"]
    }


def post_infer(
    url: str, body: Mapping[str, Any], *, timeout: float = 30.0, retries: int = 5,
    backoff: float = 0.2,
) -> tuple[dict[str, Any], int]:  # fmt: skip
    """POST a KServe v2 inference request; retry it on a connection error or a 5xx status.

    Inference is idempotent (the same inputs give the same outputs), so a request that a dying
    replica dropped is sent again; a 4xx is the request's own fault and is raised at once, and
    so is a 500 whose body says ``"retry": false`` (the model failed on it: it would again).

    Args:
        url: ``http://host:port/v2/models/<name>/infer``.
        body: the request (:func:`infer_request`).
        timeout: seconds per attempt.
        retries: further attempts after the first.
        backoff: seconds before the first retry, doubled each time.

    Returns:
        The response and the number of retries it took.

    Raises:
        KServeError: the server refused the request (4xx), with its message.
        OSError: every attempt failed; the last error.
    """
    data = json.dumps(body).encode()
    for attempt in range(retries + 1):
        request = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read()), attempt
        except urllib.error.HTTPError as exc:
            message = exc.read().decode(errors="replace")
            if exc.code not in RETRY_STATUS or attempt == retries or _final(message):
                raise KServeError(f"HTTP {exc.code} from {url}: {message}") from exc
            logger.debug("retrying %s after HTTP %s", url, exc.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == retries:
                raise
            logger.debug("retrying %s after %s", url, exc)
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def _final(message: str) -> bool:
    """Whether an error body says the server would answer the same again (``"retry": false``)."""
    try:
        body = json.loads(message)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("retry") is False
