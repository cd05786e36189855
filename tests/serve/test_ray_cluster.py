"""A two-node local Ray cluster serves an exported model over KServe v2, every answer equal to
``load()``'s, survives a replica killed mid-run, and shuts down: over HTTP with JSON (the
package's client), with binary tensor data (``tritonclient.http``) and over gRPC
(``tritonclient.grpc``).

The cluster runs in its own process (:mod:`tests.serve.two_node_scenario`), under a time limit,
in its own process group: whatever happens, nothing of it outlives the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from embedl_dynamo import export
from tests.serve.processes import run_scenario

pytest.importorskip("ray.serve")
pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

TIME_LIMIT_S = 180
PROTOCOLS = ("json", "binary", "grpc")


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    path = tmp_path_factory.mktemp("serve") / "mlp.onnx"
    return export(model, torch.randn(2, 16), path, backend="onnxruntime", progress=False)


@pytest.mark.slow  # a two-node Ray cluster, three rounds: about 40 s; the replica, batcher and
# KServe routes run in the default suite on stand-ins (test_replica*.py, test_kserve.py, ...)
def test_two_nodes_two_replicas_answer_like_load_through_a_replica_kill_in_each_protocol(mlp_file):
    seen = run_scenario(
        "tests.serve.two_node_scenario", [str(mlp_file), ",".join(PROTOCOLS)], TIME_LIMIT_S
    )
    # both nodes up, each replica holding one node's only CPU, one replica per node
    assert (seen["nodes"], seen["cpus"], seen["cpus_free"]) == (2, 2.0, 0)
    assert len(seen["replicas"]) == 2
    assert len({d["node_id"] for d in seen["described"]}) == 2
    # one thread per one-CPU replica: two replicas do not oversubscribe two cores
    assert [d["threads"] for d in seen["described"]] == [1, 1]
    assert all(d["runtime"] == "onnxruntime" for d in seen["described"])
    # the KServe v2 routes besides inference
    routes = seen["routes"]
    assert routes["ready"] == 200
    assert routes["metadata"]["inputs"] == [
        {"name": "input_0", "datatype": "FP32", "shape": [-1, 16]}
    ]
    assert routes["metadata"]["outputs"] == [
        {"name": "output_0", "datatype": "FP32", "shape": [-1, 4]}
    ]
    status, body = routes["bad_request"]
    assert status == 400 and "has shape [-1, 16]" in body["error"]
    assert routes["unknown_model"] == 404
    assert list(seen["rounds"]) == list(PROTOCOLS)
    for protocol, round_ in seen["rounds"].items():
        # one replica killed mid-run, while it held requests; every request answered, each
        # answer as load() computes it: those the kill dropped were sent again by their client
        # (retry_reasons: why)
        assert round_["answered_before"] < 40 and round_["victim_busy"] > 0, protocol
        assert (round_["answered"], round_["wrong"]) == (40, 0), protocol
        assert round_["max_abs_diff"] <= 1e-5, protocol
        assert round_["retries"] == sum(round_["retry_reasons"].values()), protocol
        # Serve replaced the killed replica: two running, the killed one not among them
        assert len(round_["replicas_after"]) == 2 and round_["running_after"] == 2, protocol
        assert round_["victim"] not in round_["replicas_after"], protocol
    # requests from concurrent clients were batched together
    survivors = [d for round_ in seen["rounds"].values() for d in round_["survivor"]]
    assert max(d["largest_batch"] for d in survivors) > 1
    assert seen["handle_max_abs_diff"] <= 1e-5
    print({p: (r["retries"], r["retry_reasons"]) for p, r in seen["rounds"].items()})
