"""Load test: N concurrent clients against ``load()`` in one process and the Ray Serve deployment.

For each client count (``--clients``, 1, 8, 32) it sends the same requests (one sample each) to:

* ``load()``: one process, one loaded module, the clients' threads calling it directly;
* Ray Serve over HTTP (KServe v2 JSON) with 1 and with 2 replicas on a two-node local cluster
  (loopback only; each node ``--cpus-per-node`` CPUs, each replica one node's CPUs);
* the same 2 replicas with one replica killed once half the requests are answered.

Rows (params: clients): requests/s, samples/s, p50 and p99 latency (each request timed by the
one timer), retries, and lost or wrong answers (wrong: more than 1e-5 from ``load()``'s). The
client retries a request on a connection error or a 5xx
(:func:`embedl_dynamo.serve.post_infer`), which is how no request is lost when a replica dies.
With ``--objective`` it measures instead what ``choose_serving`` times (samples/s and p99 of
every batch x threads setting on two nodes' CPUs; the ``latency`` objective is batch 1 with
every CPU on one worker). ``--model`` is any registered model (``mlp``, ``resnet50_nn``,
``bert_base``, ...), exported at ``--precision`` for the ``onnxruntime`` target.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from bench import models
from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import stopwatch

__all__ = ["BASELINE", "arguments", "plot", "run", "smoke", "table"]

BASELINE = None
METRICS = ("req_s", "samples_s", "p50", "p99", "retries", "lost", "wrong")
UNITS = {"req_s": "req/s", "samples_s": "samples/s", "p50": "ms", "p99": "ms"}


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    parser.add_argument("--model", default="mlp", help="a registered model")
    parser.add_argument("--precision", default="fp32", help="fp32, int8, ...")
    parser.add_argument("--clients", default="1,8,32", help="client counts, comma separated")
    parser.add_argument("--requests", type=int, default=200, help="requests per run")
    parser.add_argument("--cpus-per-node", type=int, default=1, help="CPUs per Ray node")
    parser.add_argument("--max-batch", type=int, default=8, help="rows per Serve batch")
    parser.add_argument(
        "--objective", action="store_true", help="choose_serving's settings instead"
    )
    parser.add_argument("--latency-budget-ms", type=float, help="p99 budget for --objective")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="--objective's batches")
    parser.add_argument("--runs", type=int, default=10, help="--objective's timed batches")


def smoke(args: argparse.Namespace) -> None:
    """The MLP, 40 requests, 1 and 8 clients."""
    args.model, args.requests, args.clients = "mlp", 40, "1,8"


def _add(record: Record, args, target: str, clients: int, latencies, wall: float, counts):
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None
    values = {
        "req_s": len(latencies) / wall,
        "samples_s": len(latencies) / wall,
        "p50": statistics.median(ordered) * 1e3 if ordered else None,
        "p99": p99 * 1e3 if p99 is not None else None,
        **counts,
    }
    for metric in METRICS:
        record.add(
            args.model,
            target,
            metric,
            values[metric],
            UNITS.get(metric, "count"),
            params={"clients": clients},
        )
    print(f"  {target}, {clients} clients: {values}", flush=True)


def _drive(send, requests, expected, clients: int, on_half=None):
    """Send every request from ``clients`` threads: latencies, wall seconds, lost, wrong."""
    lock, answered, fired = threading.Lock(), [0], threading.Event()
    latencies, lost, wrong = [], [0], [0]

    def one(index: int) -> None:
        with stopwatch() as elapsed:
            try:
                got = send(requests[index])
            except Exception:  # a lost request: counted, never hidden
                with lock:
                    lost[0] += 1
                return
        bad = any(np.abs(g - e).max() > 1e-5 for g, e in zip(got, expected[index]))
        with lock:
            latencies.append(elapsed())
            wrong[0] += bad
            answered[0] += 1
            if on_half and answered[0] == len(requests) // 2 and not fired.is_set():
                fired.set()
                on_half()

    with stopwatch() as wall:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, range(len(requests))))
    return latencies, wall(), lost[0], wrong[0]


def _http_sender(url: str, names: list[str], retries: list[int]) -> Callable:
    from embedl_dynamo.serve import decode_outputs, infer_request, post_infer

    def send(arrays: list[np.ndarray]) -> list[np.ndarray]:
        response, tries = post_infer(url, infer_request(arrays, names), timeout=60, retries=8)
        retries.append(tries)
        return list(decode_outputs(response).values())

    return send


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_one_replica(ray) -> Callable[[], None]:
    def kill() -> None:
        actors = ray.util.list_named_actors(all_namespaces=True)
        names = sorted(a["name"] for a in actors if a["name"].startswith("SERVE_REPLICA::"))
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        print(f"  killed {names[0]}", flush=True)

    return kill


def _sample(rng: np.random.Generator, example: torch.Tensor) -> np.ndarray:
    """One request's input shaped and typed like one row of ``example`` (token ids in range)."""
    shape = (1, *example.shape[1:])
    if example.is_floating_point():
        return rng.standard_normal(shape).astype(np.float32)
    high = max(int(example.max()) + 1, 2)
    return rng.integers(0, high, shape).astype(example.numpy().dtype)


def _exported(args: argparse.Namespace, prefix: str):
    from embedl_dynamo import export

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    model, example = models.build(args.model)
    path = export(
        model,
        example,
        workdir / f"{args.model}.onnx",
        backend="onnxruntime",
        precision=args.precision,
        progress=False,
    )
    return workdir, example, path


def _local(args: argparse.Namespace, record: Record, clients: list[int]):
    """The requests, ``load()``'s answers and its rows; returns what Ray's runs reuse."""
    from torch.utils._pytree import tree_leaves

    from embedl_dynamo import load

    _, example, path = _exported(args, "bench_serve_")
    module = load(path, device="CPU", num_threads=args.cpus_per_node)
    rng = np.random.default_rng(0)
    requests = [[_sample(rng, t) for t in example] for _ in range(args.requests)]

    def local(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(a) for a in arrays))
        return [t.numpy() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    expected = [local(r) for r in requests]
    for count in clients:
        lat, wall, lost, wrong = _drive(local, requests, expected, count)
        _add(record, args, "load()", count, lat, wall, {"lost": lost, "wrong": wrong, "retries": 0})
    return path, requests, expected, list(module.input_names)


def _ray(args, record: Record, clients: list[int], path, requests, expected, names) -> None:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from embedl_dynamo.serve import deploy

    node = {"num_cpus": args.cpus_per_node, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, log_to_driver=False)
        port = _free_port()
        url = f"http://127.0.0.1:{port}/v2/models/{args.model}/infer"
        common = {"name": args.model, "port": port, "cpus_per_replica": args.cpus_per_node}
        for replicas, kill in ((1, False), (2, False), (2, True)):
            deploy(path, replicas=replicas, max_batch_size=args.max_batch, **common)
            label = f"ray {replicas} replica{'s' * (replicas > 1)}" + (", kill" if kill else "")
            for count in clients:
                retries: list[int] = []
                on_half = _kill_one_replica(ray) if kill else None
                sender = _http_sender(url, names, retries)
                lat, wall, lost, wrong = _drive(sender, requests, expected, count, on_half)
                counts = {"lost": lost, "wrong": wrong, "retries": sum(retries)}
                _add(record, args, label, count, lat, wall, counts)
                if kill:  # the next client count starts with both replicas again
                    deploy(path, replicas=1, **common)
                    deploy(path, replicas=2, **common)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def _objective(args: argparse.Namespace, record: Record) -> None:
    """samples/s and p99 of every batch x threads setting ``choose_serving`` measures."""
    from embedl_dynamo.serve import choose_serving

    workdir, _, path = _exported(args, "bench_objective_")
    cpus = 2 * args.cpus_per_node
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    choice = choose_serving(
        path,
        cpus=cpus,
        latency_budget_ms=args.latency_budget_ms,
        batch_sizes=sizes,
        runs=args.runs,
        cache_dir=workdir / "cache",
    )
    for c in choice.candidates:
        params = {"batch": c["batch"], "threads": c["threads"], "workers": c["workers"]}
        record.add(
            args.model, "choose_serving", "samples_s", c["samples_s"], "samples/s", params=params
        )
        record.add(args.model, "choose_serving", "p99", c["p99_ms"], "ms", params=params)
    record.extra["throughput_choice"] = {
        "batch": choice.batch,
        "threads": choice.threads,
        "samples_s": choice.samples_s,
        "note": choice.note,
    }


def run(args: argparse.Namespace, record: Record) -> None:
    """``load()`` then Ray Serve at each client count (or, with ``--objective``, the settings)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback only
    os.environ.setdefault("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")  # every replica
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.objective:
        _objective(args, record)
        return
    clients = [int(c) for c in args.clients.split(",")]
    path, requests, expected, names = _local(args, record, clients)
    _ray(args, record, clients, path, requests, expected, names)


def table(record: Record, view: str = "main") -> str:
    """A line per target and client count (or per batch x threads setting)."""
    if record.settings.get("objective"):
        return by_metric(record, ("samples_s", "p99"), labels={"p99": "p99 ms (per batch)"})
    return by_metric(record, METRICS)


def plot(record: Record, path) -> None:
    """samples/s per target and client count."""
    from bench.harness.plot import bars

    bars(record, path, "samples_s")
