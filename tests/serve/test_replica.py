"""What a serving replica does, without Ray (:class:`embedl_dynamo.serve.Replica`): a model that
returns a dict, nested tuples and ``None`` is answered with named tensors over JSON and with its
structure through the handle; NaN is served or refused per request as ``load()`` does; a file
no request could be answered from fails the replica's start instead of reporting ready."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.serve import Replica, ServedArtifact
from embedl_dynamo.serve.client import decode_outputs, infer_request
from embedl_dynamo.serve.kserve import response_bytes


class _Structured(nn.Module):
    """What transformers models return: a dict, nested tuples, a None."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor):
        y = self.proj(x)
        return {"logits": torch.relu(y), "past_key_values": ((y * 2, y + 1),), "aux": None}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    model = _Structured().eval()
    root = tmp_path_factory.mktemp("replica")
    paths = {}
    for backend in ("onnxruntime", "openvino"):
        if backend == "openvino":
            pytest.importorskip("openvino")
        options = {"cache_dir": root / "cache"}
        path = root / f"{backend}.onnx"
        paths[backend] = export(
            model, torch.randn(2, 4), path, backend=backend, progress=False, options=options
        )
    return model, paths


@pytest.fixture
def torch_threads_kept():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _replica(path) -> Replica:
    return Replica(str(path), "m", 1, None)


def test_a_structured_model_is_answered_with_named_tensors_and_its_structure(
    files, torch_threads_kept
):
    model, paths = files
    replica = _replica(paths["onnxruntime"])
    metadata = replica.metadata()
    assert [o["name"] for o in metadata["outputs"]] == [
        "logits",
        "past_key_values.0.0",
        "past_key_values.0.1",
    ]
    assert metadata["omitted_outputs"] == [{"name": "aux", "value": None}]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        want = load(paths["onnxruntime"])(torch.from_numpy(x))
    got = asyncio.run(replica.infer([x]))  # the handle's answer: load()'s structure
    assert got["aux"] is None and set(got) == {"logits", "past_key_values", "aux"}
    np.testing.assert_array_equal(got["past_key_values"][0][1], want["past_key_values"][0][1])
    body = json.loads(json.dumps(infer_request([x], ["input_0"], request_id="9")))
    response = asyncio.run(replica.infer_json(body))
    assert response["id"] == "9"
    outputs = decode_outputs(json.loads(response_bytes(response)))
    np.testing.assert_array_equal(outputs["logits"], want["logits"].numpy())
    np.testing.assert_array_equal(outputs["past_key_values.0.0"], want["past_key_values"][0][0])
    body["outputs"] = [{"name": "past_key_values.0.1"}]
    only = asyncio.run(replica.infer_json(body))
    assert [o["name"] for o in only["outputs"]] == ["past_key_values.0.1"]


def test_nan_is_served_on_onnxruntime_and_refused_on_openvino_per_request(
    files, torch_threads_kept
):
    model, paths = files
    x = np.ones((2, 4), np.float32)
    x[0, 1] = np.nan
    body = json.loads(json.dumps(infer_request([x], ["input_0"])))  # NaN as Python writes it
    response = asyncio.run(_replica(paths["onnxruntime"]).infer_json(body))
    assert b"NaN" in response_bytes(response)  # answered as PyTorch computes it, not a 500
    with torch.no_grad():
        want = model(torch.from_numpy(x))["logits"].numpy()
    np.testing.assert_array_equal(decode_outputs(response)["logits"], want)  # NaN row kept
    replica = _replica(paths["openvino"])
    with pytest.raises(ValueError, match=r"input 0 \(input_0\) holds NaN.*runtime='onnxruntime'"):
        asyncio.run(replica.infer_json(body))
    clean = np.ones((1, 4), np.float32)
    refused, answered = replica.model.run_batch([[x], [clean]])  # one batch, two requests
    assert isinstance(refused, ValueError)
    with torch.no_grad():
        np.testing.assert_allclose(answered[0], model(torch.from_numpy(clean))["logits"], atol=1e-2)


def test_a_replica_that_cannot_answer_fails_to_start(files, monkeypatch, torch_threads_kept):
    def broken(self, arrays):
        raise RuntimeError("the runtime cannot run it")

    monkeypatch.setattr(ServedArtifact, "run", broken)
    with pytest.raises(RuntimeError, match="a request of zeros fails.*cannot run it"):
        _replica(files[1]["onnxruntime"])
