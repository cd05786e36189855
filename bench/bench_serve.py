"""Load test: N concurrent clients against ``load()`` in one process and the Ray Serve deployment.

For each client count (1, 8, 32 by default) it sends the same requests (one sample each) to:

* ``load()``: one process, one loaded module, the clients' threads calling it directly;
* Ray Serve over HTTP (KServe v2 JSON) with 1 and with 2 replicas on a two-node local cluster
  (loopback only; each node ``--cpus-per-node`` CPUs, each replica one node's CPUs);
* the same 2 replicas with one replica killed once half the requests are answered.

It reports requests/s, samples/s, p50 and p99 latency, retries, and lost or wrong answers (an
answer is wrong when it differs from ``load()``'s by more than 1e-5). The client retries a
request on a connection error or a 5xx (:func:`embedl_dynamo.serve.post_infer`), which is how
no request is lost when a replica dies.

    python bench/bench_serve.py --quick                       # tiny MLP, a short run
    python bench/bench_serve.py --model resnet50 --precision int8 --requests 200 --plot serve.png
    python bench/bench_serve.py --model bert_base --requests 100
    python bench/bench_serve.py --model resnet50 --objective --cpus-per-node 1   # latency vs throughput

ResNet-50 and BERT-base use random weights (bench/models.py, bench/zoo.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray address on loopback
os.environ.setdefault("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")  # spread over replicas
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from embedl_dynamo import export, load  # noqa: E402
from embedl_dynamo.serve import decode_outputs, deploy, infer_request, post_infer  # noqa: E402


def _model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if name == "mlp":
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval(), (
            torch.randn(2, 64),
        )
    if name == "resnet50":
        from bench.models import resnet50

        return resnet50(), (torch.randn(2, 3, 224, 224),)
    from bench.zoo import ZOO

    return ZOO[name][1]()


def _stats(name: str, clients: int, latencies: list[float], wall: float, samples: int) -> dict:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"target": name, "clients": clients, "req_s": len(latencies) / wall,
            "samples_s": samples / wall, "p50_ms": statistics.median(ordered) * 1e3,
            "p99_ms": p99 * 1e3}  # fmt: skip


def _drive(
    send: Callable[[list[np.ndarray]], list[np.ndarray]],
    requests: list[list[np.ndarray]],
    expected: list[list[np.ndarray]],
    clients: int,
    on_half: Callable[[], None] | None = None,
) -> tuple[list[float], float, int, int]:
    """Send every request from ``clients`` threads: latencies, wall seconds, lost, wrong."""
    lock, answered, fired = threading.Lock(), [0], threading.Event()
    latencies, lost, wrong = [], [0], [0]

    def one(index: int) -> None:
        start = time.perf_counter()
        try:
            got = send(requests[index])
        except Exception:  # a lost request: counted, never hidden
            with lock:
                lost[0] += 1
            return
        elapsed = time.perf_counter() - start
        bad = any(np.abs(g - e).max() > 1e-5 for g, e in zip(got, expected[index]))
        with lock:
            latencies.append(elapsed)
            wrong[0] += bad
            answered[0] += 1
            if on_half and answered[0] == len(requests) // 2 and not fired.is_set():
                fired.set()
                on_half()

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(requests))))
    return latencies, time.perf_counter() - start, lost[0], wrong[0]


def _http_sender(url: str, names: list[str], retries: list[int]) -> Callable:
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
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["name"].startswith("SERVE_REPLICA::"))  # fmt: skip
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        print(f"  killed {names[0]}", flush=True)

    return kill


def _sample(rng: np.random.Generator, example: torch.Tensor) -> np.ndarray:
    """One request's input shaped and typed like one row of ``example`` (token ids in its range)."""
    shape = (1, *example.shape[1:])
    if example.is_floating_point():
        return rng.standard_normal(shape).astype(np.float32)
    high = max(int(example.max()) + 1, 2)
    return rng.integers(0, high, shape).astype(example.numpy().dtype)


def run(args: argparse.Namespace) -> list[dict]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    workdir = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    model, example = _model(args.model)
    path = export(model, example, workdir / f"{args.model}.onnx", backend="onnxruntime",
                  precision=args.precision, progress=False)  # fmt: skip
    module = load(path, device="CPU", num_threads=args.cpus_per_node)
    rng = np.random.default_rng(0)
    requests = [[_sample(rng, t) for t in example] for _ in range(args.requests)]

    def local(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(a) for a in arrays))
        leaves = tree_leaves(out)  # load() gives the model's own structure (a BERT output dict)
        return [t.numpy() for t in leaves if isinstance(t, torch.Tensor)]

    expected = [local(r) for r in requests]
    names = list(module.input_names)
    rows: list[dict] = []
    for clients in args.clients:
        lat, wall, lost, wrong = _drive(local, requests, expected, clients)
        rows.append({**_stats("load()", clients, lat, wall, len(lat)), "lost": lost,
                     "wrong": wrong, "retries": 0})  # fmt: skip
        print(rows[-1], flush=True)
    node = {"num_cpus": args.cpus_per_node, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, log_to_driver=False)
        port = _free_port()
        url = f"http://127.0.0.1:{port}/v2/models/{args.model}/infer"
        for replicas, kill in ((1, False), (2, False), (2, True)):
            deploy(path, name=args.model, port=port, replicas=replicas,
                   cpus_per_replica=args.cpus_per_node, max_batch_size=args.max_batch)  # fmt: skip
            label = f"ray {replicas} replica{'s' * (replicas > 1)}" + (", kill" if kill else "")
            for clients in args.clients:
                retries: list[int] = []
                on_half = _kill_one_replica(ray) if kill else None
                lat, wall, lost, wrong = _drive(_http_sender(url, names, retries), requests,
                                                expected, clients, on_half)  # fmt: skip
                rows.append({**_stats(label, clients, lat, wall, len(lat)), "lost": lost,
                             "wrong": wrong, "retries": sum(retries)})  # fmt: skip
                print(rows[-1], flush=True)
                if kill:  # the next client count starts with both replicas again
                    deploy(path, name=args.model, port=port, replicas=1,
                           cpus_per_replica=args.cpus_per_node)  # fmt: skip
                    deploy(path, name=args.model, port=port, replicas=2,
                           cpus_per_replica=args.cpus_per_node)  # fmt: skip
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return rows


def _table(rows: list[dict]) -> str:
    head = "| target | clients | req/s | samples/s | p50 ms | p99 ms | retries | lost | wrong |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['target']} | {r['clients']} | {r['req_s']:.1f} | {r['samples_s']:.1f} "
                     f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['retries']} | {r['lost']} "
                     f"| {r['wrong']} |")  # fmt: skip
    return "\n".join(lines)


def _plot(rows: list[dict], out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(dict.fromkeys(r["target"] for r in rows))
    clients = list(dict.fromkeys(r["clients"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(targets)
    for i, target in enumerate(targets):
        values = [next((r["samples_s"] for r in rows if r["target"] == target
                        and r["clients"] == c), 0) for c in clients]  # fmt: skip
        ax.bar([x + i * width for x in range(len(clients))], values, width, label=target)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(clients))], [str(c) for c in clients])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("samples/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="mlp, resnet50, or a bench.zoo name")
    parser.add_argument("--precision", default="fp32", help="fp32, int8, ...")
    parser.add_argument("--clients", default="1,8,32", help="client counts, comma separated")
    parser.add_argument("--requests", type=int, default=200, help="requests per run")
    parser.add_argument("--cpus-per-node", type=int, default=1, help="CPUs per Ray node")
    parser.add_argument("--max-batch", type=int, default=8, help="rows per Serve batch")
    parser.add_argument("--plot", help="write a PNG of samples/s per target and client count")
    parser.add_argument("--quick", action="store_true", help="tiny MLP, 40 requests, 1 and 8")
    parser.add_argument("--objective", action="store_true",
                        help="only objective=latency vs throughput (choose_serving) on 2 nodes' CPUs")  # fmt: skip
    parser.add_argument("--latency-budget-ms", type=float, help="p99 budget for --objective")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="--objective's batches")
    parser.add_argument("--runs", type=int, default=10, help="--objective's timed batches")
    args = parser.parse_args()
    if args.quick:
        args.model, args.requests, args.clients = "mlp", 40, "1,8"
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.objective:
        objective_table(args)
        return
    rows = run(args)
    print(f"\n{args.model} {args.precision}, {args.requests} requests of one sample, "
          f"{args.cpus_per_node} CPU(s) per node, CPU: {_cpu()}")  # fmt: skip
    print(_table(rows))
    if args.plot:
        _plot(rows, args.plot, f"{args.model} {args.precision}: samples/s")
        print(f"wrote {args.plot}")


def objective_table(args: argparse.Namespace) -> None:
    """samples/s and p99 of every batch x threads setting ``choose_serving`` measures; the
    ``latency`` objective's setting is batch 1 with every CPU on one worker."""
    from embedl_dynamo.serve import choose_serving

    workdir = Path(tempfile.mkdtemp(prefix="bench_objective_"))
    model, example = _model(args.model)
    path = export(model, example, workdir / f"{args.model}.onnx", backend="onnxruntime",
                  precision=args.precision, progress=False)  # fmt: skip
    cpus = 2 * args.cpus_per_node
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    choice = choose_serving(path, cpus=cpus, latency_budget_ms=args.latency_budget_ms,
                            batch_sizes=sizes, runs=args.runs, cache_dir=workdir / "cache")  # fmt: skip
    latency = next(c for c in choice.candidates if c["batch"] == 1 and c["threads"] == cpus)
    print(f"\n{args.model} {args.precision}, {cpus} CPUs, CPU: {_cpu()}")
    print("| batch | threads x workers | samples/s | p99 ms (per batch) |\n|---|---|---|---|")
    for c in choice.candidates:
        print(f"| {c['batch']} | {c['threads']} x {c['workers']} | {c['samples_s']:.1f} "
              f"| {c['p99_ms']:.2f} |")  # fmt: skip
    print(f"\nobjective=latency: batch 1, {cpus} threads: {latency['samples_s']:.1f} samples/s")
    print(f"objective=throughput: {choice.note}: batch {choice.batch}, {choice.threads} "
          f"thread(s) x {cpus // choice.threads}: {choice.samples_s:.1f} samples/s "
          f"({choice.samples_s / latency['samples_s']:.2f}x)")  # fmt: skip


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
