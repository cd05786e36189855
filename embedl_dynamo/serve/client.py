"""The client side of KServe v2 over HTTP with JSON: a request body, its response's arrays, and
a POST that retries what another try may answer.

:func:`infer_request` writes a request body for numpy arrays, :func:`decode_outputs` reads a
response's outputs back, :func:`post_infer` sends it and retries an idempotent request on a
connection error or a 502/503/500 from a replica that died mid-request, never a 4xx, nor a 500
the server marked ``"retry": false`` (the model's own failure, which another try would repeat).
Triton's own clients (``tritonclient.http``, ``tritonclient.grpc``) speak the binary forms; this
is the small dependency-free client for JSON (:mod:`embedl_dynamo.serve.kserve` is the server's
side).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embedl_dynamo.errors import KServeError
from embedl_dynamo.serve.kserve import DATATYPES, datatype_name

__all__ = ["RETRY_STATUS", "decode_outputs", "infer_request", "post_infer"]

logger = logging.getLogger(__name__)

RETRY_STATUS = (500, 502, 503, 504)


def infer_request(
    arrays: Sequence[np.ndarray], names: Sequence[str], request_id: str | None = None
) -> dict[str, Any]:
    """A KServe v2 JSON request body for ``arrays`` (flat row-major data)."""
    inputs = []
    for name, array in zip(names, arrays, strict=True):
        array = np.asarray(array)
        if datatype_name(array.dtype) is None:
            raise KServeError(f"input {name!r}: dtype {array.dtype} has no KServe datatype")
        inputs.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype_name(array.dtype),
                "data": array.ravel().tolist(),
            }
        )
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
    url: str,
    body: Mapping[str, Any],
    *,
    timeout: float = 30.0,
    retries: int = 5,
    backoff: float = 0.2,
) -> tuple[dict[str, Any], int]:
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
