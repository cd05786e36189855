"""KServe v2's binary tensor data extension (:mod:`embedl_dynamo.serve.binary`), without Ray:
request bodies written by ``tritonclient.http``'s own encoder are read back to the same arrays
(float and int64, binary beside JSON), responses are read by tritonclient's ``InferResult``, and
every body that does not add up is refused naming the problem (the server's HTTP 400)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedl_dynamo.errors import KServeError
from embedl_dynamo.serve.binary import read_request, response_body, tensor_from_bytes
from embedl_dynamo.serve.kserve import TensorSpec, decode_inputs, response_parts

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.http._utils import _get_inference_request  # noqa: E402 - the client's encoder

SPECS = [TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1, 4))]
OUTS = [TensorSpec("logits", "FP32", (-1, 3)), TensorSpec("count", "INT64", (-1,))]


def _input(name: str, array: np.ndarray, binary: bool = True):
    datatype = {np.float32: "FP32", np.int64: "INT64", np.bool_: "BOOL"}[array.dtype.type]
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _body(inputs, outputs=None, parameters=None) -> tuple[bytes, str | None]:
    """A request as tritonclient.http sends it: the body and its header length (or None)."""
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id="7",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=parameters,
    )
    return body, None if json_size is None else str(json_size)


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    x[0, 1] = np.nan  # NaN travels as bits, as it does in JSON
    ids = rng.integers(-(2**40), 2**40, (2, 4)).astype(np.int64)
    return x, ids


@pytest.mark.parametrize("binary", [(True, True), (True, False), (False, True)])
def test_tritonclients_request_reads_back_to_the_same_arrays(binary):
    x, ids = _arrays()
    body, length = _body([_input("ids", ids, binary[1]), _input("x", x, binary[0])])
    header, arrays = read_request(body, length)
    got = decode_inputs(header, SPECS, arrays)
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], ids)
    assert [a.dtype for a in got] == [np.float32, np.int64]
    assert all(a.flags.writeable and a.flags.aligned for a in arrays.values())


def test_a_json_request_is_still_read_without_the_header():
    x, ids = _arrays()
    x[0, 1] = 0.5
    body, length = _body([_input("x", x, False), _input("ids", ids, False)])
    assert length is None
    header, arrays = read_request(body, None)
    assert arrays == {}
    got = decode_inputs(header, SPECS, arrays)
    np.testing.assert_array_equal(got[0], x)


def _response(request: dict, arrays) -> tuple:
    header, raw = response_parts("m", OUTS, arrays, request)
    body, length = response_body(header, raw)
    return httpclient.InferResult.from_response_body(body, header_length=length), body, length


def test_outputs_asked_for_as_binary_data_are_read_by_tritonclient():
    logits, count = np.array([[1, np.nan, 3]], np.float32), np.array([2**50], np.int64)
    asked = [
        httpclient.InferRequestedOutput("logits", binary_data=True),
        httpclient.InferRequestedOutput("count", binary_data=False),
    ]
    request = json.loads(_body([], asked)[0])
    result, body, length = _response(request, [logits, count])
    np.testing.assert_array_equal(result.as_numpy("logits"), logits)
    np.testing.assert_array_equal(result.as_numpy("count"), count)
    outputs = json.loads(body[:length])["outputs"]
    assert outputs[0]["parameters"] == {"binary_data_size": 12} and "data" not in outputs[0]
    assert outputs[1]["data"] == [2**50]  # asked for as JSON
    assert json.loads(body[:length])["id"] == "7"


def test_binary_data_output_makes_every_output_binary_and_json_stays_the_default():
    logits, count = np.ones((1, 3), np.float32), np.arange(1, dtype=np.int64)
    request = json.loads(_body([])[0])  # tritonclient without outputs: binary_data_output
    assert request["parameters"] == {"binary_data_output": True}
    result, body, length = _response(request, [logits, count])
    assert length is not None and len(body) == length + 12 + 8
    np.testing.assert_array_equal(result.as_numpy("count"), count)
    body, length = response_body(*response_parts("m", OUTS, [logits, count], {"inputs": []}))
    assert length is None and json.loads(body)["outputs"][0]["data"] == [1.0, 1.0, 1.0]


def _bad(header: dict, tail: bytes = b"", length: str | None = "auto"):
    text = json.dumps(header).encode()
    with pytest.raises(KServeError) as caught:
        header, arrays = read_request(text + tail, str(len(text)) if length == "auto" else length)
        decode_inputs(header, SPECS, arrays)
    return str(caught.value)


def _entry(name="x", shape=(1, 3), datatype="FP32", size=12, **extra):
    parameters = {"binary_data_size": size}
    return {
        "name": name,
        "shape": list(shape),
        "datatype": datatype,
        "parameters": parameters,
        **extra,
    }


def test_sizes_that_do_not_add_up_are_refused_naming_the_input():
    floats = np.ones(3, np.float32).tobytes()
    assert "has 14 bytes after its JSON header, but its inputs' binary_data_size add up to 12" in (
        _bad({"inputs": [_entry()]}, floats + b"xx")
    )
    assert "binary_data_size=12 at byte 0 runs past the 8 bytes" in _bad(
        {"inputs": [_entry()]}, floats[:8]
    )
    assert "input 'x': 8 bytes of binary data, but shape [1, 3] of FP32 is 12 bytes" in _bad(
        {"inputs": [_entry(size=8)]}, floats[:8]
    )
    assert "must be a byte count within the" in _bad({"inputs": [_entry()]}, floats, "9999")
    assert "must be a byte count within the" in _bad({"inputs": [_entry()]}, floats, "-3")
    assert "binary_data_size must be a byte count, got -1" in _bad({"inputs": [_entry(size=-1)]})


def test_malformed_binary_inputs_are_refused_naming_the_problem():
    assert "datatype 'BF16' is not supported" in _bad(
        {"inputs": [_entry(datatype="BF16", size=6)]}, bytes(6)
    )
    assert "datatype 'BYTES' is not supported" in _bad(
        {"inputs": [_entry(datatype="BYTES", size=6)]}, bytes(6)
    )
    assert "byte 1 (2) is not a BOOL" in _bad(
        {"inputs": [_entry("b", (3,), "BOOL", 3)]}, bytes([1, 2, 0])
    )
    assert "has both data and binary_data_size" in _bad(
        {"inputs": [_entry(data=[1, 2, 3])]}, bytes(12)
    )
    assert "has no Inference-Header-Content-Length header" in _bad(
        {"inputs": [_entry()]}, length=None
    )
    assert "shared memory is not served here" in _bad(
        {"inputs": [{**_entry(), "parameters": {"shared_memory_region": "r"}}]}
    )
    assert "is not JSON" in _bad({"inputs": []}, length="3")  # the header cut short
    assert "Content-Encoding 'gzip' is not read here" in str(
        pytest.raises(KServeError, read_request, b"{}", None, "gzip").value
    )


def test_outputs_asked_for_with_extensions_not_served_are_refused():
    arrays = [np.ones((1, 3), np.float32), np.ones(1, np.int64)]
    cases = [
        ({"classification": 3}, "classification is not served"),
        ({"binary_data": "yes"}, "binary_data must be true or false"),
    ]
    for parameters, match in cases:
        request = {"outputs": [{"name": "logits", "parameters": parameters}]}
        with pytest.raises(KServeError, match=match):
            response_parts("m", OUTS, arrays, request)


def test_a_bool_tensor_reads_its_bytes():
    got = tensor_from_bytes("b", "BOOL", [2, 2], bytes([1, 0, 0, 1]))
    np.testing.assert_array_equal(got, [[True, False], [False, True]])
