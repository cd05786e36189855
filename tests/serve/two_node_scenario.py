"""A two-node local Ray cluster serving an exported model, run as its own process.

``python -m tests.serve.two_node_scenario MODEL.onnx json,binary,grpc`` starts a head and a
second node (one CPU each, loopback only, no dashboard), starts Serve with its HTTP and gRPC
proxies, deploys the model with two replicas (one CPU each, so one per node), then runs one
round per protocol named (default ``json``): KServe v2 requests from concurrent clients, each
with a client of its own, in ``json`` (:func:`embedl_dynamo.serve.post_infer`), ``binary``
(``tritonclient.http``, binary tensor data) or ``grpc`` (``tritonclient.grpc``); one replica
killed mid-run; every answer checked against :func:`embedl_dynamo.load` in this process; and a
wait for Serve to replace the killed replica before the next round. It prints one JSON line
with what it saw, the retries of requests the killed replica dropped and why included. One
cluster serves every round: starting one costs far more than a round. Serve, Ray and the cluster
are shut down in ``finally``; ``tests/serve/test_ray_cluster.py`` runs it under a time limit and
kills its process group when it ends.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# before Ray is imported: every address on loopback (Ray's single-machine mode), the HTTP proxy
# spreading requests over both replicas rather than preferring its own node's, no usage reports
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedl_dynamo import load  # noqa: E402
from embedl_dynamo.serve import (  # noqa: E402
    decode_outputs,
    deploy,
    grpc_options,
    infer_request,
    post_infer,
)
from embedl_dynamo.serve.grpc_ingress import grpc_setup_hook  # noqa: E402
from tests.serve.processes import free_port  # noqa: E402

PROTOCOLS = ("json", "binary", "grpc")
REQUESTS, CLIENTS, KILL_AFTER, RETRIES = 40, 8, 12, 6
ATTEMPT_S = 10  # a request's try: milliseconds here, unless its answer is lost on the way
QUIET = {"log_level": "WARNING", "enable_access_log": False}
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024**2}
# Serve finds a killed replica by its next health check (every 10 s by default) and waits up to
# 20 s for a replica's requests to drain when it stops one: seconds here, the test waits for both
QUICK_RECOVERY = {"health_check_period_s": 0.5, "graceful_shutdown_timeout_s": 1}


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


Send = Callable[[np.ndarray], tuple[np.ndarray, int]]  # an answer, and the retries it took


class _Reasons(Counter):
    """Why requests were retried, counted from the clients' threads at once."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def add(self, reason: str) -> None:
        with self.lock:
            self[reason] += 1


def _json_client(port: int) -> tuple[Send, Callable[[], None]]:
    """The package's JSON client: :func:`post_infer` retries by itself (its debug log says
    why: :class:`_RetryLog`)."""
    url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"

    def send(x: np.ndarray) -> tuple[np.ndarray, int]:
        body = infer_request([x], ["input_0"])
        response, retries = post_infer(url, body, timeout=ATTEMPT_S, retries=RETRIES)
        return decode_outputs(response)["output_0"], retries

    return send, lambda: None


class _RetryLog(logging.Handler):
    """Counts why :func:`post_infer` retried, from its ``retrying URL after REASON`` lines."""

    def __init__(self, reasons: _Reasons) -> None:
        super().__init__(logging.DEBUG)
        self.reasons = reasons

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.add(record.getMessage().partition(" after ")[2])


def _retryable(exc: Exception) -> str | None:
    """Why a tritonclient call is worth another try (the request reached a dying replica or no
    replica, or its answer did not come), or None: a connection error or timeout, an HTTP 5xx,
    a gRPC ``UNAVAILABLE``, ``INTERNAL`` or ``DEADLINE_EXCEEDED``; not where the model itself
    failed (another try would fail the same)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, OSError):
        return type(exc).__name__
    if not isinstance(exc, InferenceServerException):
        return None
    status, message = str(exc.status()), str(exc.message())
    if message.startswith("the model failed"):  # tritonclient drops the body's "retry": false
        return None
    if status in ("500", "502", "503", "504"):
        return f"HTTP {status}"
    retried = ("StatusCode.UNAVAILABLE", "StatusCode.INTERNAL", "StatusCode.DEADLINE_EXCEEDED")
    return status if status in retried else None


def _triton_client(protocol: str, port: int, reasons: _Reasons) -> tuple[Send, Callable[[], None]]:
    """tritonclient's own client for ``protocol`` (binary HTTP or gRPC), with the retries
    :func:`post_infer` would make: up to ``RETRIES`` more tries, a growing pause between."""
    if protocol == "binary":
        import tritonclient.http as triton

        client = triton.InferenceServerClient(
            f"127.0.0.1:{port}", connection_timeout=ATTEMPT_S, network_timeout=ATTEMPT_S
        )
        asked, timeout = [triton.InferRequestedOutput("output_0", binary_data=True)], {}
    else:
        import tritonclient.grpc as triton

        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        asked, timeout = [triton.InferRequestedOutput("output_0")], {"client_timeout": ATTEMPT_S}

    def send(x: np.ndarray) -> tuple[np.ndarray, int]:
        tensor = triton.InferInput("input_0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, **({"binary_data": True} if protocol == "binary" else {}))
        for attempt in range(RETRIES + 1):
            try:
                result = client.infer("mlp", [tensor], outputs=asked, **timeout)
                return result.as_numpy("output_0"), attempt
            except Exception as exc:
                reason = _retryable(exc)
                if reason is None or attempt == RETRIES:
                    raise
                reasons.add(reason)
            time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    return send, client.close


def _load_test(connect, inputs: list[np.ndarray], reference, kill) -> dict:
    """Send every request from ``CLIENTS`` threads, each with the client ``connect()`` gives it
    (its send and close); once ``KILL_AFTER`` are answered, a thread of its own calls ``kill``
    (with a test of whether requests are still outstanding) while the clients go on."""
    done, lock, armed = [0], threading.Lock(), threading.Event()
    results: list = [None] * len(inputs)
    killed: dict = {}

    def client(first: int) -> None:
        send, close = connect()
        try:
            for index in range(first, len(inputs), CLIENTS):
                results[index] = send(inputs[index])
                with lock:
                    done[0] += 1
                if done[0] >= KILL_AFTER:
                    armed.set()
        finally:
            close()

    def killer() -> None:
        armed.wait()
        killed["victim_busy"] = kill(lambda: done[0] < len(inputs))
        killed["answered_before"] = done[0]

    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        killing = pool.submit(killer)
        try:
            for future in [pool.submit(client, first) for first in range(CLIENTS)]:
                future.result()
        finally:
            armed.set()  # where a client failed before KILL_AFTER answers, the killer ends too
        killing.result()
    diffs = [float(np.abs(got - reference(x)).max()) for x, (got, _) in zip(inputs, results)]
    return {
        "answered": sum(r is not None for r in results),
        "max_abs_diff": max(diffs),
        "wrong": sum(d > 1e-5 for d in diffs),
        "exact": sum(d == 0 for d in diffs),
        "retries": sum(r for _, r in results),
        **killed,
    }


def _kill_when_busy(ray, victim: str) -> Callable[[Callable[[], bool]], int]:
    """A ``kill`` for :func:`_load_test`: kill the replica ``victim`` once it holds requests
    (so that some are dropped, for their clients to send again), or once none are outstanding;
    it returns how many it held."""

    def kill(outstanding: Callable[[], bool]) -> int:
        actor = ray.get_actor(victim, namespace="serve")
        deadline, busy = time.monotonic() + 10, 0
        while outstanding() and time.monotonic() < deadline:
            # Serve's replica actor counts the requests it holds (queued in the batcher too)
            busy = ray.get(actor.get_num_ongoing_requests.remote(), timeout=10)
            if busy:
                break
        ray.kill(actor, no_restart=True)
        return busy

    return kill


def _start(ray, serve, cluster) -> dict[str, int]:
    """Join the cluster and start Serve with its HTTP and gRPC proxies (Serve fixes its gRPC
    servicers when it starts: the way :func:`deploy`'s error message names); their ports."""
    ports = {"http": free_port(), "grpc": free_port()}
    hook = grpc_setup_hook(loopback=True)  # the proxy passes tritonclient's messages on
    ray.init(
        address=cluster.address,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": hook},
    )
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": "127.0.0.1", "port": ports["http"]},
        grpc_options=grpc_options(ports["grpc"]),
        logging_config=QUIET,
    )
    return ports


def _ready(protocol: str, ports: dict[str, int]) -> bool:
    """Whether the proxy for ``protocol`` routes to the model yet (``serve.run`` returns once
    the replicas run; a proxy learns the route on its own time)."""
    try:
        if protocol == "grpc":
            import tritonclient.grpc as triton

            with triton.InferenceServerClient(f"127.0.0.1:{ports['grpc']}") as client:
                return client.is_model_ready("mlp", client_timeout=5)
        return _get(f"http://127.0.0.1:{ports['http']}/v2/models/mlp/ready")[0] == 200
    except Exception:  # noqa: BLE001 - not routed yet
        return False


def _replaced(ray, serve, victim: str) -> dict:
    """Wait (30 s at most) for Serve to replace the killed replica: two replicas running, the
    killed one not among them."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = _replica_names(ray)
        states = serve.status().applications["mlp"].deployments["mlp"].replica_states
        if victim not in names and len(names) == 2 and states.get("RUNNING", 0) == 2:
            break
        time.sleep(0.5)
    return {"replicas_after": names, "running_after": states.get("RUNNING", 0)}


def _kill_round(
    ray, serve, handle, protocol: str, ports: dict[str, int], reference, newest: set[str]
) -> dict:
    """The load test in ``protocol``, killing a replica mid-run, one not ``newest`` (the
    replacement a previous round waited for: the last replica a proxy learns of); then the
    replicas that answered, and Serve's replacement of the killed one."""
    deadline = time.monotonic() + 30
    while not _ready(protocol, ports) and time.monotonic() < deadline:
        time.sleep(0.2)
    names, reasons = _replica_names(ray), _Reasons()
    victim = min(names, key=lambda name: (name in newest, name))
    log, retry_log = logging.getLogger("embedl_dynamo.serve.client"), _RetryLog(reasons)
    if protocol == "json":
        log.setLevel(logging.DEBUG)
        log.addHandler(retry_log)
        connect = lambda: _json_client(ports["http"])  # noqa: E731
    else:
        port = ports["http" if protocol == "binary" else "grpc"]
        connect = lambda: _triton_client(protocol, port, reasons)  # noqa: E731
    try:
        kill = _kill_when_busy(ray, victim)
        seen = {"replicas_before": names, "victim": victim}
        seen.update(_load_test(connect, _requests(16), reference, kill))
    finally:
        log.removeHandler(retry_log)
    seen["retry_reasons"] = dict(reasons)
    seen["survivor"] = _describe(handle, 1)
    return {**seen, **_replaced(ray, serve, victim)}


def main(path: str, protocols: list[str]) -> dict:
    if not set(protocols) <= set(PROTOCOLS):
        raise SystemExit(f"protocols {protocols}: each one of {PROTOCOLS}")
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
        ports = _start(ray, serve, cluster)
        handle = deploy(
            path,
            name="mlp",
            port=ports["http"],
            replicas=2,
            cpus_per_replica=1,
            max_batch_size=4,
            batch_wait_timeout_s=0.05,  # requests wait in a replica: the kill drops some
            deployment_options=QUICK_RECOVERY,
        )
        summary["nodes"] = sum(n["Alive"] for n in ray.nodes())
        summary["cpus"] = ray.cluster_resources().get("CPU", 0)
        summary["cpus_free"] = ray.available_resources().get("CPU", 0)
        summary["replicas"] = _replica_names(ray)
        summary["described"] = _describe(handle)
        summary["routes"] = _routes(f"http://127.0.0.1:{ports['http']}")
        summary["rounds"], newest = {}, set()
        for protocol in protocols:  # each kills a replica and waits for its replacement
            seen = _kill_round(ray, serve, handle, protocol, ports, reference, newest)
            newest = set(seen["replicas_after"]) - set(seen["replicas_before"])
            summary["rounds"][protocol] = seen
        x = np.ones((2, 16), np.float32)
        got = handle.infer.remote([x]).result(timeout_s=30)  # load()'s structure: one array
        summary["handle_max_abs_diff"] = float(np.abs(got - reference(x)).max())
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return summary


if __name__ == "__main__":
    protocols = sys.argv[2].split(",") if len(sys.argv) > 2 else ["json"]
    print(json.dumps(main(sys.argv[1], protocols)), flush=True)
