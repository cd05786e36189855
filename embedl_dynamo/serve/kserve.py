"""The KServe v2 inference protocol's JSON form, as Triton and OpenVINO Model Server speak it.

A request is ``{"id": ..., "inputs": [{"name", "shape", "datatype", "data"}], "outputs":
[{"name"}]}`` with ``data`` the tensor's elements in row-major order (a flat list; nested lists
are accepted too); the response has the same form under ``"outputs"``. :func:`decode_inputs`
checks a request against the model's inputs and returns numpy arrays in the model's order,
:func:`encode_response` writes the outputs back, :func:`model_metadata` answers
``GET /v2/models/<name>``. :func:`infer_request` and :func:`post_infer` are the client side
(the request body, and an HTTP POST that retries an idempotent request on a connection error or
a 502/503/500 from a replica that died mid-request).

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
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise KServeError(f"input {name!r}: shape must be a list of sizes, got {shape!r}")
    try:
        array = np.asarray(entry["data"], dtype=DATATYPES[datatype])
    except (TypeError, ValueError) as exc:
        raise KServeError(f"input {name!r}: data is not {datatype} ({exc})") from exc
    if array.size != math.prod(shape):
        raise KServeError(
            f"input {name!r}: shape {shape} holds {math.prod(shape)} elements, data has "
            f"{array.size}"
        )
    return name, array.reshape(shape)


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
    replica dropped is sent again; a 4xx is the request's own fault and is raised at once.

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
            if exc.code not in RETRY_STATUS or attempt == retries:
                message = exc.read().decode(errors="replace")
                raise KServeError(f"HTTP {exc.code} from {url}: {message}") from exc
            logger.debug("retrying %s after HTTP %s", url, exc.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == retries:
                raise
            logger.debug("retrying %s after %s", url, exc)
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")
