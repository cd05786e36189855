"""The KServe v2 JSON protocol and the replica's batching, without Ray: requests decoded and
checked against the model, batches stacked and split so each request gets ``load()``'s answer."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.serve import ServedArtifact
from embedl_dynamo.serve.client import decode_outputs, infer_request, post_infer
from embedl_dynamo.serve.kserve import (
    KServeError,
    TensorSpec,
    decode_inputs,
    encode_response,
    response_bytes,
)

SPECS = [TensorSpec("ids", "INT64", (-1, 5)), TensorSpec("x", "FP32", (-1, 8))]


def test_a_request_round_trips_in_the_models_input_order():
    ids, x = np.arange(10, dtype=np.int64).reshape(2, 5), np.ones((2, 8), np.float32)
    body = json.loads(json.dumps(infer_request([x, ids], ["x", "ids"], request_id="7")))
    got = decode_inputs(body, SPECS)
    assert [a.dtype for a in got] == [np.int64, np.float32]
    np.testing.assert_array_equal(got[0], ids)
    np.testing.assert_array_equal(got[1], x)
    response = encode_response("m", [TensorSpec("y", "FP32", (-1, 8))], [x * 2], body)
    assert (response["id"], response["model_name"]) == ("7", "m")
    np.testing.assert_array_equal(decode_outputs(json.loads(json.dumps(response)))["y"], x * 2)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: b["inputs"].pop(), r"missing \['x'\]"),
        (lambda b: b["inputs"][1].update(datatype="FP64"), "'x' is FP32, got FP64"),
        (lambda b: b["inputs"][1].update(shape=[2, 7]), r"holds 14 elements, data has 16"),
        (lambda b: b["inputs"][1].update(shape=[4, 4]), r"has shape \[-1, 8\]"),
        (lambda b: b["inputs"][1].update(datatype="BF16"), "'BF16' is not supported"),
        (lambda b: b["inputs"][0].update(name="idz"), r"unknown \['idz'\]"),
        (lambda b: b.pop("inputs"), '"inputs" list'),
    ],
)
def test_bad_requests_name_the_problem(change, match):
    body = infer_request([np.zeros((2, 5), np.int64), np.zeros((2, 8), np.float32)], ["ids", "x"])
    change(body)
    with pytest.raises(KServeError, match=match):
        decode_inputs(body, SPECS)


def _one_input(datatype: str, text: str) -> dict:
    """A request whose one input ``v`` has the JSON ``data`` text (as a client sent it)."""
    body = '{"inputs": [{"name": "v", "shape": [2], "datatype": "%s", "data": %s}]}'
    return json.loads(body % (datatype, text))


@pytest.mark.parametrize(
    "datatype, data, match",
    [
        ("FP32", "[1.0, null]", "element 1 is null"),
        ("FP32", "[1, null]", "element 1 is null"),
        ("FP64", "[1, 1%s]" % ("0" * 400), "element 1 .* is outside FP64's range"),
        ("FP32", '[1.0, "2"]', "element 1 is a str, not a number"),
        ("FP32", "[1e39, 1]", r"element 0 \(1e\+39\) is outside FP32's range"),
        ("FP16", "[70000, 1]", "outside FP16's range"),
        ("INT64", "[1.5, 2]", r"element 0 \(1.5\) is not an integer"),
        ("INT64", "[NaN, 2]", "is not an integer"),
        ("INT64", "[9223372036854775808, 1.0]", "outside INT64's range"),
        ("INT64", "[1267650600228229401496703205376, 1]", "outside INT64's range"),
        ("UINT8", "[-1, 2]", "outside UINT8's range"),
        ("BOOL", "[1, 0]", "is not true or false"),
        ("FP32", "[true, false]", "is true or false, not a number"),
        ("FP32", "[[1], [2, 3]]", "not nested lists of one shape"),
    ],
)
def test_what_a_datatype_cannot_hold_is_refused_not_converted(datatype, data, match):
    """numpy would read null as NaN, "2" as 2, 1.5 as 1 and 1e39 as FP32's inf: a silent
    answer to another request (and an HTTP 500 where the output became NaN)."""
    with pytest.raises(KServeError, match=match):
        decode_inputs(_one_input(datatype, data), [TensorSpec("v", datatype, (2,))])


def test_nan_and_infinity_are_taken_and_answered_as_pythons_json_writes_them():
    (got,) = decode_inputs(_one_input("FP32", "[NaN, -Infinity]"), [TensorSpec("v", "FP32", (2,))])
    assert np.isnan(got[0]) and got[1] == -np.inf and got.dtype == np.float32
    response = encode_response("m", [TensorSpec("y", "FP32", (2,))], [got])
    text = response_bytes(response)
    assert b"[NaN,-Infinity]" in text  # FastAPI's strict encoder fails here: HTTP 500
    back = decode_outputs(json.loads(text))["y"]
    assert np.isnan(back[0]) and back[1] == -np.inf


def test_only_the_requested_outputs_are_returned():
    specs = [TensorSpec("a", "FP32", (1,)), TensorSpec("b", "INT64", (1,))]
    arrays = [np.ones(1, np.float32), np.ones(1, np.int64)]
    response = encode_response("m", specs, arrays, {"outputs": [{"name": "b"}]})
    assert [o["name"] for o in response["outputs"]] == ["b"]
    with pytest.raises(KServeError, match="unknown outputs"):
        encode_response("m", specs, arrays, {"outputs": [{"name": "c"}]})


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    root = tmp_path_factory.mktemp("served")
    dynamic = export(model, torch.randn(2, 16), root / "mlp.onnx", backend="onnxruntime")
    static = export(
        model, torch.randn(2, 16), root / "static.onnx", backend="onnxruntime", dynamic_batch=False
    )
    return dynamic, static


def test_a_batch_of_requests_gives_each_its_own_answer_as_load_does(mlp):
    served = ServedArtifact(mlp[0], max_batch_size=8)
    assert served.batchable and served.max_rows == 8
    assert [s.to_dict() for s in served.inputs] == [
        {"name": "input_0", "datatype": "FP32", "shape": [-1, 16]}
    ]
    reference = load(mlp[0], device="CPU")
    rng = np.random.default_rng(0)
    requests = [[rng.standard_normal((rows, 16)).astype(np.float32)] for rows in (1, 3, 2, 1)]
    answers = served.run_batch(requests)
    assert served.largest_batch == 4  # one run for the four requests
    for (x,), (got,) in zip(requests, answers):
        assert got.shape == (x.shape[0], 4)
        with torch.no_grad():
            np.testing.assert_allclose(got, reference(torch.from_numpy(x)).numpy(), atol=1e-6)


@pytest.fixture
def torch_threads_kept():
    """ServedArtifact(threads=n) sets PyTorch's threads, as a replica should; not this process's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_static_batch_file_runs_each_request_alone(mlp, torch_threads_kept):
    served = ServedArtifact(mlp[1], threads=1)
    assert not served.batchable and served.max_rows == 1
    assert served.module.artifact_runtime.settings.num_threads == 1
    x = np.ones((2, 16), np.float32)
    [[a], [b]] = served.run_batch([[x], [2 * x]])
    assert served.largest_batch == 1
    assert not np.allclose(a, b)


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 (a replica that died) to the first POST, then echoes the request's id."""

    calls = 0

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        status, reply = (503, {}) if type(self).calls == 1 else (200, {"id": body["id"]})
        if body["id"] == "bad":
            status, reply = 400, {"error": "input 'x' is FP32, got FP64"}
        if body["id"] == "model":  # the model's own failure: it would fail again
            status, reply = 500, {"error": "the model failed", "retry": False}
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_the_client_retries_a_dropped_request_and_not_a_refused_one():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v2/models/m/infer"
        assert post_infer(url, {"id": "1"}, backoff=0.01) == ({"id": "1"}, 1)
        with pytest.raises(KServeError, match="HTTP 400.*got FP64"):
            post_infer(url, {"id": "bad"}, backoff=0.01)
        assert _Flaky.calls == 3  # the refused request was sent once
        with pytest.raises(KServeError, match="HTTP 500.*the model failed"):
            post_infer(url, {"id": "model"}, backoff=0.01)
        assert _Flaky.calls == 4  # a 500 marked "retry": false was sent once too
    finally:
        server.shutdown()
        server.server_close()
