"""A two-node local Ray cluster serving an exported model, run as its own process.

``python -m tests.serve.two_node_scenario MODEL.onnx`` starts a head and a second node (one CPU
each, loopback only, no dashboard), deploys the model with two replicas (one CPU each, so one per
node), sends concurrent KServe v2 requests over HTTP, kills one replica mid-run, checks every
answer against :func:`embedl_dynamo.load` in this process, and prints one JSON line with what it
saw. Serve, Ray and the cluster are shut down in ``finally``. ``tests/serve/test_ray_cluster.py``
runs it under a time limit and kills its process group if it overruns (the cluster's reaper then
ends the Ray processes).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# before Ray is imported: every address on loopback (Ray's single-machine mode), the HTTP proxy
# spreading requests over both replicas rather than preferring its own node's, no usage reports
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedl_dynamo import load  # noqa: E402
from embedl_dynamo.serve import decode_outputs, deploy, infer_request, post_infer  # noqa: E402

REQUESTS, CLIENTS, KILL_AFTER = 40, 8, 12
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024**2}
# Serve finds a killed replica by its next health check (every 10 s by default) and waits up to
# 20 s for a replica's requests to drain when it stops one: seconds here, the test waits for both
QUICK_RECOVERY = {"health_check_period_s": 0.5, "graceful_shutdown_timeout_s": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica_names(ray) -> list[str]:
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::")
    )


def _get(url: str, body: dict | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET, or of a POST of ``body``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _routes(base: str) -> dict:
    """Health, metadata, and the answers to a malformed request and to an unknown model."""
    bad = {"inputs": [{"name": "input_0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    return {
        "ready": _get(f"{base}/v2/health/ready")[0],
        "metadata": _get(f"{base}/v2/models/mlp")[1],
        "bad_request": _get(f"{base}/v2/models/mlp/infer", bad),
        "unknown_model": _get(f"{base}/v2/models/nope/infer", bad)[0],
    }


def _describe(handle, replicas: int = 2) -> list[dict]:
    """What the replicas say about themselves: rounds of concurrent calls (the router spreads
    them) until ``replicas`` have answered, at most five rounds."""
    described: dict[str, dict] = {}
    for _ in range(5):
        calls = [handle.describe.remote() for _ in range(16)]
        described.update({d["replica"]: d for d in (c.result(timeout_s=30) for c in calls)})
        if len(described) >= replicas:
            break
    return sorted(described.values(), key=lambda d: d["replica"])


def _requests(features: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1 + i % 3, features)).astype(np.float32) for i in range(REQUESTS)]


def _load_test(url: str, inputs: list[np.ndarray], reference, kill) -> dict:
    """Send every request from ``CLIENTS`` threads; call ``kill`` once ``KILL_AFTER`` answered."""
    done, lock, killed = [0], threading.Lock(), threading.Event()

    def one(x: np.ndarray):
        response, retries = post_infer(url, infer_request([x], ["input_0"]), timeout=20, retries=6)
        with lock:
            done[0] += 1
            if done[0] == KILL_AFTER and not killed.is_set():
                killed.set()
                kill()
        return decode_outputs(response)["output_0"], retries

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(one, inputs))
    diffs = [float(np.abs(got - reference(x)).max()) for x, (got, _) in zip(inputs, results)]
    return {
        "answered": len(results),
        "max_abs_diff": max(diffs),
        "wrong": sum(d > 1e-5 for d in diffs),
        "retries": sum(r for _, r in results),
        "killed_mid_run": killed.is_set(),
    }


def main(path: str) -> dict:
    logging.getLogger("ray").setLevel(logging.WARNING)
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    module = load(path, device="CPU", num_threads=1)

    def reference(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    summary: dict = {}
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        cluster.add_node(**NODE)
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        port = _free_port()
        handle = deploy(
            path,
            name="mlp",
            port=port,
            replicas=2,
            cpus_per_replica=1,
            max_batch_size=4,
            batch_wait_timeout_s=0.01,
            deployment_options=QUICK_RECOVERY,
        )
        summary["nodes"] = sum(n["Alive"] for n in ray.nodes())
        summary["cpus"] = ray.cluster_resources().get("CPU", 0)
        summary["cpus_free"] = ray.available_resources().get("CPU", 0)
        summary["replicas"] = _replica_names(ray)
        victim = summary["replicas"][0]
        summary["described"] = _describe(handle)

        def kill() -> None:
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)

        summary["routes"] = _routes(f"http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        summary.update(_load_test(url, _requests(16), reference, kill))
        x = np.ones((2, 16), np.float32)
        got = handle.infer.remote([x]).result(timeout_s=30)  # load()'s structure: one array
        summary["handle_max_abs_diff"] = float(np.abs(got - reference(x)).max())
        summary["survivor"] = _describe(handle, 1)
        deadline = time.monotonic() + 30  # Serve replaces the killed replica
        while time.monotonic() < deadline and (
            victim in _replica_names(ray) or len(_replica_names(ray)) < 2
        ):
            time.sleep(0.5)
        summary["replicas_after"] = _replica_names(ray)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
