"""A two-node local Ray cluster serves an exported model over HTTP (KServe v2), every answer
equal to ``load()``'s, survives a replica killed mid-run, and shuts down.

The cluster runs in its own process (:mod:`tests.serve.two_node_scenario`), under a time limit,
in its own process group: whatever happens, nothing of it outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from embedl_dynamo import export

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 150


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    path = tmp_path_factory.mktemp("serve") / "mlp.onnx"
    return export(model, torch.randn(2, 16), path, backend="onnxruntime", progress=False)


def _run_scenario(path: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.serve.two_node_scenario", str(path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the scenario and every process it started
        out, err = child.communicate()
        pytest.fail(f"the cluster scenario ran over {TIME_LIMIT_S} s:\n{err[-3000:]}")
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # a two-node Ray cluster: about 30 s; the replica, batcher and KServe routes
# run in the default suite on stand-ins (test_replica*.py, test_batcher.py, test_kserve.py)
def test_two_nodes_two_replicas_answer_like_load_through_a_replica_kill(mlp_file):
    seen = _run_scenario(mlp_file)
    # both nodes up, each replica holding one node's only CPU, one replica per node
    assert (seen["nodes"], seen["cpus"], seen["cpus_free"]) == (2, 2.0, 0)
    assert len(seen["replicas"]) == 2
    assert len({d["node_id"] for d in seen["described"]}) == 2
    # one thread per one-CPU replica: two replicas do not oversubscribe two cores
    assert [d["threads"] for d in seen["described"]] == [1, 1]
    assert all(d["runtime"] == "onnxruntime" for d in seen["described"])
    # every request answered, each answer as load() computes it, one replica killed mid-run
    assert seen["killed_mid_run"]
    assert (seen["answered"], seen["wrong"]) == (40, 0)
    assert seen["max_abs_diff"] <= 1e-5
    assert seen["handle_max_abs_diff"] <= 1e-5
    # requests from concurrent clients were batched together
    assert max(d["largest_batch"] for d in seen["survivor"]) > 1
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
    # Serve replaced the killed replica
    assert len(seen["replicas_after"]) == 2
    assert seen["replicas"][0] not in seen["replicas_after"]
