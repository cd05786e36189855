"""KServe v2's binary tensor data extension, as Triton's clients speak it by default.

A request with binary data is its JSON header followed by the tensors' raw bytes; the
``Inference-Header-Content-Length`` header says where the JSON ends. Each input sent that way
says ``"parameters": {"binary_data_size": n}`` in place of ``data``, its bytes following the
JSON in the order of ``inputs`` (row-major, little-endian, BOOL one byte per element). A response
is written the same way for the outputs asked for as binary data (``"parameters":
{"binary_data": true}`` on a requested output, or ``"binary_data_output": true`` among the
request's parameters): ``binary_data_size`` in the output's JSON, its bytes after the JSON, and
the JSON's length in the response's ``Inference-Header-Content-Length``
(``tritonclient.http``'s ``InferResult`` reads them). Tensors stay numpy buffers end to end:
:func:`tensor_from_bytes` reads them with ``np.frombuffer``, :func:`response_body` joins their
buffers; no Python list of elements is made.

Every size is checked before a byte is read: an input whose ``binary_data_size`` is not its shape
times its datatype's size, sizes that do not add up to the bytes after the JSON, a header length
beyond the body, a datatype without a numpy form here (``BF16``, ``BYTES``) or a BOOL byte other
than 0 or 1 is a :class:`~embedl_dynamo.errors.KServeError` naming the input, which the server
answers with HTTP 400. Arrays are copied out of the request once, so each is aligned and
writable (PyTorch warns on read-only ones).

Nothing here imports Ray; the gRPC methods (:mod:`embedl_dynamo.serve.grpc_ingress`) read their
``raw_input_contents`` with the same :func:`tensor_from_bytes`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embedl_dynamo.errors import KServeError, error_line
from embedl_dynamo.serve.kserve import DATATYPES, response_bytes, tensor_header

__all__ = ["HEADER_LENGTH", "read_request", "response_body", "tensor_bytes", "tensor_from_bytes"]

#: the HTTP header that says how many bytes of the body are JSON
HEADER_LENGTH = "Inference-Header-Content-Length"


def tensor_from_bytes(
    name: str, datatype: str, shape: Sequence[int], data: bytes | memoryview
) -> np.ndarray:
    """The array of ``shape`` and ``datatype`` held in ``data`` (little-endian, row-major), as
    an aligned, writable copy.

    Raises:
        KServeError: the datatype has no numpy form here, ``data`` is not the shape's size, or
            a BOOL byte is neither 0 nor 1.
    """
    if datatype not in DATATYPES:
        raise KServeError(
            f"input {name!r}: datatype {datatype!r} is not supported; use one of "
            f"{', '.join(DATATYPES)}"
        )
    native = DATATYPES[datatype]
    expected = math.prod(shape) * native.itemsize
    if len(data) != expected:
        raise KServeError(
            f"input {name!r}: {len(data)} bytes of binary data, but shape {list(shape)} of "
            f"{datatype} is {expected} bytes"
        )
    if datatype == "BOOL":
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            index = int(np.flatnonzero(raw > 1)[0])
            raise KServeError(
                f"input {name!r}: byte {index} ({int(raw[index])}) is not a BOOL (0 or 1)"
            )
        return raw.astype(np.bool_).reshape(shape)
    return np.frombuffer(data, dtype=native.newbyteorder("<")).astype(native).reshape(shape)


def tensor_bytes(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` as the binary extension sends them: row-major, little-endian."""
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return memoryview(array).cast("B")


def _binary_size(entry: Any, index: int) -> int | None:
    """An input's ``binary_data_size`` (None: its data is JSON), checked to be a byte count."""
    parameters = entry.get("parameters") if isinstance(entry, Mapping) else None
    if not isinstance(parameters, Mapping):
        return None
    if "shared_memory_region" in parameters:
        raise KServeError(f"inputs[{index}]: shared memory is not served here; send the data")
    size = parameters.get("binary_data_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise KServeError(f"inputs[{index}]: binary_data_size must be a byte count, got {size!r}")
    return size


def _binary_inputs(header: Any, tail: memoryview, framed: bool) -> dict[int, np.ndarray]:
    """The inputs sent as binary data, by their index in ``header["inputs"]``, read in order
    from ``tail`` (the bytes after the JSON header)."""
    entries = header.get("inputs") if isinstance(header, Mapping) else None
    arrays: dict[int, np.ndarray] = {}
    offset = 0
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        size = _binary_size(entry, index)
        if size is None:
            continue
        name, shape, datatype = tensor_header(entry, index)
        if "data" in entry:
            raise KServeError(f"input {name!r} has both data and binary_data_size; send one")
        if not framed:
            raise KServeError(
                f"input {name!r} says binary_data_size={size}, but the request has no "
                f"{HEADER_LENGTH} header to say where its JSON ends"
            )
        if offset + size > len(tail):
            raise KServeError(
                f"input {name!r}: binary_data_size={size} at byte {offset} runs past the "
                f"{len(tail)} bytes after the JSON header"
            )
        arrays[index] = tensor_from_bytes(name, datatype, shape, tail[offset : offset + size])
        offset += size
    if offset != len(tail):
        raise KServeError(
            f"the request has {len(tail)} bytes after its JSON header, but its inputs' "
            f"binary_data_size add up to {offset}"
        )
    return arrays


def read_request(
    body: bytes, header_length: str | None = None, content_encoding: str | None = None
) -> tuple[Any, dict[int, np.ndarray]]:
    """A request body as (its JSON, the arrays of the inputs sent as binary data by their index
    in ``inputs``); without ``header_length`` the whole body is JSON.

    Args:
        body: the HTTP request's body.
        header_length: its ``Inference-Header-Content-Length`` header, if any.
        content_encoding: its ``Content-Encoding`` header, if any (only ``identity`` is read).

    Raises:
        KServeError: a body or header that does not add up (see the module's docstring).
    """
    if content_encoding not in (None, "", "identity"):
        raise KServeError(
            f"Content-Encoding {content_encoding!r} is not read here; send the request uncompressed"
        )
    length = len(body)
    if header_length is not None:
        text = header_length.strip()
        if not text.isdigit() or int(text) > len(body):
            raise KServeError(
                f"{HEADER_LENGTH}: {header_length!r} must be a byte count within the "
                f"{len(body)}-byte body"
            )
        length = int(text)
    try:
        header = json.loads(body[:length])
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        where = "the request body" if header_length is None else "the request's JSON header"
        raise KServeError(f"{where} is not JSON ({error_line(exc)})") from exc
    tail = memoryview(body)[length:]
    return header, _binary_inputs(header, tail, header_length is not None)


def response_body(header: Mapping[str, Any], raw: Sequence[np.ndarray]) -> tuple[bytes, int | None]:
    """The HTTP response body for a response's JSON and the arrays that follow it
    (:func:`~embedl_dynamo.serve.kserve.response_parts`), and the length of its JSON for the
    ``Inference-Header-Content-Length`` header (None: the body is JSON alone)."""
    text = response_bytes(header)
    if not raw:
        return text, None
    return b"".join([text, *(tensor_bytes(array) for array in raw)]), len(text)
