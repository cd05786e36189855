"""A replica's answers over KServe v2's binary HTTP form and over gRPC, without Ray: requests
written by tritonclient's own encoders (``tritonclient.http`` and ``tritonclient.grpc``), for a
model with float and int64 inputs that returns a dict, are answered with ``load()``'s outputs,
and read back by tritonclient's result classes; JSON is still answered; a request that does not
fit gets ``INVALID_ARGUMENT`` (gRPC) naming the problem, another model's name ``NOT_FOUND``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.serve import Replica
from embedl_dynamo.serve.kserve import KServeError

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc._utils import _get_inference_request as grpc_request  # noqa: E402
from tritonclient.http._utils import _get_inference_request as http_request  # noqa: E402


class _Mixed(nn.Module):
    """Float features and int64 token ids in; a dict with a float, an int64 and a None out."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.embed = nn.Linear(4, 3), nn.Embedding(10, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor):
        logits = self.proj(x) + self.embed(ids).sum(1)
        return {"logits": logits, "extra": (logits.relu(), ids * 2), "none": None}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("wire")
    example = (torch.randn(2, 4), torch.randint(0, 10, (2, 5)))
    path = export(
        _Mixed().eval(),
        example,
        root / "mixed.onnx",
        backend="onnxruntime",
        progress=False,
        options={"cache_dir": root / "cache"},
    )
    threads = torch.get_num_threads()
    replica = Replica(str(path), "mixed", 1, None)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ids = rng.integers(0, 10, (3, 5)).astype(np.int64)
    with torch.no_grad():
        want = load(path)(torch.from_numpy(x), torch.from_numpy(ids))
    expected = {"logits": want["logits"], "extra.0": want["extra"][0], "extra.1": want["extra"][1]}
    return replica, x, ids, {k: v.numpy() for k, v in expected.items()}


def _inputs(module, x, ids, binary=True):
    tensors = [
        module.InferInput("input_0", list(x.shape), "FP32"),
        module.InferInput("input_1", list(ids.shape), "INT64"),
    ]
    for tensor, array in zip(tensors, (x, ids)):
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
    return tensors


def _http(inputs, outputs=None) -> tuple[bytes, str | None]:
    body, size = http_request(inputs, "9", outputs, 0, False, False, 0, None, None)
    return body, None if size is None else str(size)


def test_a_lone_request_waits_for_no_batch(served):
    from embedl_dynamo.serve.ray_serve import DEFAULT_BATCH_WAIT_S

    assert DEFAULT_BATCH_WAIT_S == 0 and served[0].batcher.wait_s == 0


def test_binary_http_answers_like_load(served):
    replica, x, ids, expected = served
    asked = [httpclient.InferRequestedOutput(name, binary_data=True) for name in expected]
    body, length = asyncio.run(replica.infer_bytes(*_http(_inputs(httpclient, x, ids), asked)))
    assert length is not None
    result = httpclient.InferResult.from_response_body(body, header_length=length)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert result.get_response()["id"] == "9"


def test_json_and_mixed_requests_are_still_answered(served):
    replica, x, ids, expected = served
    asked = [httpclient.InferRequestedOutput("extra.1", binary_data=False)]
    body, length = asyncio.run(
        replica.infer_bytes(*_http(_inputs(httpclient, x, ids, binary=False), asked))
    )
    assert length is None  # all JSON: curl reads it
    result = httpclient.InferResult.from_response_body(body)
    np.testing.assert_array_equal(result.as_numpy("extra.1"), expected["extra.1"])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["extra.1"]


def test_a_bad_binary_request_is_refused_before_the_model_runs(served):
    replica, x, ids, _ = served
    body, length = _http(_inputs(httpclient, x, ids))
    with pytest.raises(KServeError, match="binary_data_size add up to 168"):
        asyncio.run(replica.infer_bytes(body + b"\0", length))
    as_int = httpclient.InferInput("input_0", list(x.shape), "INT64")
    as_int.set_data_from_numpy(x.astype(np.int64))
    with pytest.raises(KServeError, match="input 'input_0' is FP32, got INT64"):
        asyncio.run(replica.infer_bytes(*_http([as_int, _inputs(httpclient, x, ids)[1]])))


class _Context:
    """What Ray Serve passes as ``grpc_context``: the call's status."""

    def __init__(self) -> None:
        self.code, self.details = None, ""

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


def _grpc(inputs, outputs=None, model="mixed"):
    return grpc_request(model, inputs, "", "4", outputs, 0, False, False, 0, None, None)


def test_grpc_model_infer_answers_like_load(served):
    replica, x, ids, expected = served
    context = _Context()
    response = asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x, ids)), context))
    assert context.code is None, context.details
    result = grpcclient.InferResult(response)
    for name, want in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), want)
    assert (response.id, response.model_name) == ("4", "mixed")
    asked = [grpcclient.InferRequestedOutput("extra.1")]
    response = asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x, ids), asked)))
    assert [o.name for o in response.outputs] == ["extra.1"]
    np.testing.assert_array_equal(
        grpcclient.InferResult(response).as_numpy("extra.1"), expected["extra.1"]
    )


def test_grpc_refusals_carry_a_status_naming_the_problem(served):
    import grpc

    replica, x, ids, _ = served
    context = _Context()
    asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x[:, :3], ids)), context))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'input_0' has shape [-1, 4] (-1: any size), got [3, 3]" in context.details
    context = _Context()
    asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x, ids), model="other"), context))
    assert context.code == grpc.StatusCode.NOT_FOUND and "'other'" in context.details
    request = _grpc(_inputs(grpcclient, x, ids))
    request.model_version = "2"
    context = _Context()
    asyncio.run(replica.ModelInfer(request, context))
    assert context.code == grpc.StatusCode.NOT_FOUND and "version '2'" in context.details
    request = _grpc(_inputs(grpcclient, x, ids))
    del request.raw_input_contents[1]
    context = _Context()
    asyncio.run(replica.ModelInfer(request, context))
    assert "1 raw_input_contents for 2 inputs" in context.details


def test_grpc_typed_contents_are_read_and_checked(served):
    import grpc

    replica, x, ids, expected = served
    request = _grpc(_inputs(grpcclient, x, ids))
    del request.raw_input_contents[:]
    request.inputs[0].contents.fp32_contents.extend(x.ravel().tolist())
    request.inputs[1].contents.int64_contents.extend(ids.ravel().tolist())
    response = asyncio.run(replica.ModelInfer(request, _Context()))
    np.testing.assert_array_equal(
        grpcclient.InferResult(response).as_numpy("extra.1"), expected["extra.1"]
    )
    request.inputs[0].contents.fp32_contents.append(1.0)
    context = _Context()
    asyncio.run(replica.ModelInfer(request, context))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "shape [3, 4] holds 12 elements, data has 13" in context.details


def test_grpc_metadata_and_health(served):
    from tritonclient.grpc import service_pb2

    replica = served[0]
    metadata = asyncio.run(replica.ModelMetadata(service_pb2.ModelMetadataRequest(name="mixed")))
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("input_0", "FP32", [-1, 4]),
        ("input_1", "INT64", [-1, 5]),
    ]
    assert [t.name for t in metadata.outputs] == ["logits", "extra.0", "extra.1"]
    assert asyncio.run(replica.ModelReady(service_pb2.ModelReadyRequest(name="mixed"))).ready
    assert not asyncio.run(replica.ModelReady(service_pb2.ModelReadyRequest(name="x"))).ready
    assert asyncio.run(replica.ServerLive(service_pb2.ServerLiveRequest())).live


def _stats(replica) -> dict:
    return replica.statistics.to_kserve()["model_stats"][0]


def test_statistics_count_each_request_by_stage_and_outcome(served):
    replica, x, ids, _ = served
    before = _stats(replica)
    asyncio.run(replica.infer_bytes(*_http(_inputs(httpclient, x, ids))))
    asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x, ids)), _Context()))
    asyncio.run(replica.ModelInfer(_grpc(_inputs(grpcclient, x[:, :3], ids)), _Context()))
    after = _stats(replica)
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - old["success"]["count"] == 2
    assert stats["fail"]["count"] - old["fail"]["count"] == 1  # the [3, 3] input
    assert after["inference_count"] - before["inference_count"] == 2 * len(x)
    assert after["execution_count"] - before["execution_count"] == 2
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[stage]["count"] - old[stage]["count"] == 2, stage
        assert stats[stage]["ns"] > old[stage]["ns"], stage
    # a request's stages lie within its whole stay in the replica
    spent = sum(stats[s]["ns"] - old[s]["ns"] for s in ("compute_input", "compute_infer"))
    assert spent <= stats["success"]["ns"] - old["success"]["ns"]
    assert [b["batch_size"] for b in after["batch_stats"]] == [len(x)]
    assert after["last_inference"] > 0


def test_statistics_are_answered_over_grpc_in_tritonclients_messages(served):
    import grpc
    from tritonclient.grpc import service_pb2

    replica = served[0]
    asyncio.run(replica.infer([np.zeros((2, 4), np.float32), np.zeros((2, 5), np.int64)]))
    response = asyncio.run(
        replica.ModelStatistics(service_pb2.ModelStatisticsRequest(name="mixed"))
    )
    (entry,) = response.model_stats
    expected = _stats(replica)
    assert (entry.name, entry.version) == ("mixed", "1")
    assert entry.inference_count == expected["inference_count"] > 0
    assert (
        entry.inference_stats.compute_infer.ns == expected["inference_stats"]["compute_infer"]["ns"]
    )
    assert entry.inference_stats.success.count == expected["inference_stats"]["success"]["count"]
    context = _Context()
    asyncio.run(replica.ModelStatistics(service_pb2.ModelStatisticsRequest(name="x"), context))
    assert context.code == grpc.StatusCode.NOT_FOUND and "'x'" in context.details
