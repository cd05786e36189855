"""Serving without the JSON tax: Triton's clients (binary HTTP, gRPC) on Ray Serve against load().

For each model (``--models``, ``name:precision`` pairs: ResNet-50 in plain ``torch.nn`` at int8
and BERT-base by default), exported for the ``onnxruntime`` target, and each client count
(``--clients``, 1 and 8), the same one-sample requests go to:

* ``load()``: the clients' threads calling ``load()``'s module in this process (its threads
  = ``--cpus``), the baseline;
* ``http binary``: ``tritonclient.http`` with binary tensor data, against one Ray Serve
  replica of ``--cpus`` CPUs that :func:`embedl_dynamo.serve.deploy` starts on a local Ray
  instance of its own;
* ``grpc``: ``tritonclient.grpc`` against the same replica through Serve's gRPC proxy;
* ``http json`` (``--json``): the package's JSON client, the path before binary data.

Where the served time goes (``--stages``, on by default), from the replica's statistics
(the KServe v2 statistics extension, read with tritonclient before and after each run), as mean
ms per request: ``server_ms`` (the request's stay in the replica), split into ``queue_ms``,
``input_ms`` (reading the request), ``infer_ms`` (the batch's run of the file) and ``output_ms``
(the answer), and ``transport_ms``, the client's mean latency (``mean_ms``) less
``server_ms``: the client, the wire and Ray Serve's proxy. ``busy`` is the share of the run's
wall time the replica spent running the file, ``mean_batch`` its rows per run.

Clients and server share the machine's CPUs in every run, as they do for ``load()``. Rows
(params: clients): requests/s, p50 and p99 (ratios to ``load()`` at the same client count, the
baseline), lost and wrong answers (wrong: more than 1e-5 from ``load()``'s answer), and
``req_s_vs_load``, the requests/s as a ratio to ``load()``'s in this run; ``p50_over_load``
is the single-client p50 minus ``load()``'s, in ms. Random weights (``bench.models``); the INT8
file is held to ``accuracy_budget=0.95`` (random weights miss the default).
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

BASELINE = "load()"
METRICS = ("req_s", "req_s_vs_load", "p50", "p99", "p50_over_load", "lost", "wrong")
UNITS = {"req_s": "req/s", "req_s_vs_load": "x", "p50": "ms", "p99": "ms"}
UNITS["p50_over_load"] = "ms over"
UNITS["mean_ms"] = "ms"
# a served request's time by stage (mean ms per request), from the replica's statistics
STAGES = {
    "queue": "queue_ms",
    "compute_input": "input_ms",
    "compute_infer": "infer_ms",
    "compute_output": "output_ms",
}
STAGE_METRICS = ("mean_ms", "server_ms", *STAGES.values(), "transport_ms", "busy", "mean_batch")


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    pairs = "resnet50_nn:int8,bert_base:fp32"
    parser.add_argument("--models", default=pairs, help="name:precision pairs, comma separated")
    parser.add_argument("--clients", default="1,8", help="client counts, comma separated")
    parser.add_argument("--requests", type=int, default=200, help="requests per run")
    parser.add_argument("--cpus", type=int, default=2, help="the replica's CPUs (and load()'s)")
    parser.add_argument("--max-batch", type=int, default=8, help="rows per replica batch")
    parser.add_argument("--json", action="store_true", help="also the JSON client")


def smoke(args: argparse.Namespace) -> None:
    """The MLP in fp32, 40 requests, 1 and 8 clients."""
    args.models, args.requests, args.clients = "mlp:fp32", 40, "1,8"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample(rng: np.random.Generator, example: torch.Tensor) -> np.ndarray:
    """One request's input shaped and typed like one row of ``example`` (token ids in range)."""
    shape = (1, *example.shape[1:])
    if example.is_floating_point():
        return rng.standard_normal(shape).astype(np.float32)
    high = max(int(example.max()) + 1, 2)
    return rng.integers(0, high, shape).astype(example.numpy().dtype)


def _calibration(example: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Four batches of four rows like ``example``: random floats, the example's token ids."""
    torch.manual_seed(1)
    return [
        tuple(
            torch.randn(4, *t.shape[1:])
            if t.is_floating_point()
            else t.repeat(4, *[1] * (t.dim() - 1))
            for t in example
        )
        for _ in range(4)
    ]


def _export(name: str, precision: str, workdir: Path):
    from embedl_dynamo import export

    model, example = models.build(name)
    example = tuple(example) if isinstance(example, tuple | list) else (example,)
    path = export(
        model,
        example,
        workdir / f"{name}.onnx",
        backend="onnxruntime",
        precision=precision,
        calibration_data=_calibration(example) if precision != "fp32" else None,
        progress=False,
        options={"accuracy_budget": 0.95, "cache_dir": workdir / "cache"},
    )
    return path, example


def _drive(send: Callable, requests, expected, clients: int):
    """Send every request from ``clients`` threads: latencies (s), wall (s), lost, wrong."""
    lock, latencies, counts = threading.Lock(), [], {"lost": 0, "wrong": 0}

    def one(index: int) -> None:
        with stopwatch() as elapsed:
            try:
                got = send(requests[index])
            except Exception:  # a lost request: counted, never hidden
                with lock:
                    counts["lost"] += 1
                return
        bad = any(np.abs(g - e).max() > 1e-5 for g, e in zip(got, expected[index]))
        with lock:
            latencies.append(elapsed())
            counts["wrong"] += bad

    with stopwatch() as wall:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, range(len(requests))))
    return latencies, wall(), counts


def _add(record: Record, model: str, variant: str, clients: int, result, base) -> dict:
    latencies, wall, counts = result
    ordered = sorted(latencies)
    values = {
        "req_s": len(latencies) / wall,
        "wall_s": wall,
        "p50": statistics.median(ordered) * 1e3 if ordered else None,
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3 if ordered else None,
        **counts,
    }
    if base is not None and values["p50"] is not None:
        values["req_s_vs_load"] = values["req_s"] / base["req_s"]
        if clients == 1:
            values["p50_over_load"] = values["p50"] - base["p50"]
    values["mean_ms"] = statistics.fmean(ordered) * 1e3 if ordered else None
    for metric in (*METRICS, "mean_ms"):
        if metric in values and values[metric] is not None:
            unit = UNITS.get(metric, "count")
            record.add(model, variant, metric, values[metric], unit, params={"clients": clients})
    print(f"  {model} {variant}, {clients} clients: {values}", flush=True)
    return values


def _served_statistics(http_port: int, name: str) -> dict:
    """The replica's cumulative inference statistics, as tritonclient reads them."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    return client.get_inference_statistics(name)["model_stats"][0]


def _add_stages(record: Record, model: str, variant: str, clients: int, values, before, after):
    """Rows of where a served request's time went in one run: the replica's statistics after
    the run less those before it, per request, beside the client's mean latency."""
    stats, old = after["inference_stats"], before["inference_stats"]
    served = stats["success"]["count"] - old["success"]["count"]
    if not served or values.get("mean_ms") is None:
        return
    per_request = {
        metric: (stats[stage]["ns"] - old[stage]["ns"]) / served / 1e6
        for stage, metric in STAGES.items()
    }
    server = (stats["success"]["ns"] - old["success"]["ns"]) / served / 1e6
    runs = after["execution_count"] - before["execution_count"]
    ran_ns = sum(b["compute_infer"]["ns"] for b in after["batch_stats"]) - sum(
        b["compute_infer"]["ns"] for b in before["batch_stats"]
    )
    staged = {
        **per_request,
        "server_ms": server,
        "transport_ms": values["mean_ms"] - server,
        "busy": ran_ns / 1e9 / values["wall_s"],
        "mean_batch": (after["inference_count"] - before["inference_count"]) / max(runs, 1),
    }
    for metric, value in staged.items():
        unit = "ms" if metric.endswith("_ms") else "x"
        record.add(model, variant, metric, value, unit, params={"clients": clients})
    shown = {k: round(v, 2) for k, v in staged.items()}
    print(f"  {model} {variant}, {clients} clients, per request: {shown}", flush=True)


def _senders(http_port: int, grpc_port: int, name: str, names, dtypes, outputs) -> dict:
    """One request's send function per wire; each client thread gets its own clients."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from embedl_dynamo.serve import decode_outputs, infer_request, post_infer

    local = threading.local()

    def client(module, port: int):
        key = module.__name__
        if not hasattr(local, key):
            setattr(local, key, module.InferenceServerClient(f"127.0.0.1:{port}"))
        return getattr(local, key)

    def tensors(module, arrays):
        made = [module.InferInput(n, list(a.shape), d) for n, a, d in zip(names, arrays, dtypes)]
        for tensor, array in zip(made, arrays):
            tensor.set_data_from_numpy(array)
        return made

    def http(arrays):
        asked = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
        result = client(httpclient, http_port).infer(
            name, tensors(httpclient, arrays), outputs=asked
        )
        return [result.as_numpy(o) for o in outputs]

    def grpc(arrays):
        result = client(grpcclient, grpc_port).infer(name, tensors(grpcclient, arrays))
        return [result.as_numpy(o) for o in outputs]

    def json_client(arrays):
        url = f"http://127.0.0.1:{http_port}/v2/models/{name}/infer"
        response, _ = post_infer(url, infer_request(arrays, names), timeout=120)
        got = decode_outputs(response)
        return [got[o] for o in outputs]

    return {"http binary": http, "grpc": grpc, "http json": json_client}


def _one_model(args, record: Record, spec: str, clients: list[int]) -> None:
    from torch.utils._pytree import tree_leaves

    from embedl_dynamo import load
    from embedl_dynamo.serve import deploy, undeploy
    from embedl_dynamo.serve.kserve import datatype_name

    name, _, precision = spec.partition(":")
    path, example = _export(name, precision or "fp32", Path(tempfile.mkdtemp(prefix="wire_")))
    module = load(path, device="CPU", num_threads=args.cpus)
    rng = np.random.default_rng(0)
    requests = [[_sample(rng, t) for t in example] for _ in range(args.requests)]

    def call(arrays):
        with torch.no_grad():
            out = module(*(torch.from_numpy(a) for a in arrays))
        return [t.numpy() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    expected = [call(r) for r in requests]
    base = {}
    for count in clients:
        result = _drive(call, requests, expected, count)
        base[count] = _add(record, name, "load()", count, result, None)
    http_port, grpc_port = _free_port(), _free_port()
    deploy(
        path,
        name=name,
        port=http_port,
        grpc_port=grpc_port,
        cpus_per_replica=args.cpus,
        max_batch_size=args.max_batch,
    )
    try:
        import tritonclient.http as httpclient

        metadata = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}").get_model_metadata(
            name
        )
        outputs = [o["name"] for o in metadata["outputs"]]
        dtypes = [datatype_name(a.dtype) for a in requests[0]]
        senders = _senders(http_port, grpc_port, name, list(module.input_names), dtypes, outputs)
        wires = ["http binary", "grpc"] + ["http json"] * args.json
        for wire in wires:
            send = senders[wire]
            send(requests[0])  # the connection and the replica's first call, untimed
            for count in clients:
                before = _served_statistics(http_port, name)
                result = _drive(send, requests, expected, count)
                values = _add(record, name, wire, count, result, base[count])
                after = _served_statistics(http_port, name)
                _add_stages(record, name, wire, count, values, before, after)
    finally:
        undeploy(name)


def run(args: argparse.Namespace, record: Record) -> None:
    """``load()``, then binary HTTP and gRPC on Ray Serve, per model and client count."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    clients = [int(c) for c in args.clients.split(",")]
    for spec in args.models.split(","):
        _one_model(args, record, spec, clients)


def table(record: Record, view: str = "main") -> str:
    """A line per model, wire and client count: throughput and latency (``main``), or where a
    served request's time went (``stages``)."""
    return by_metric(record, STAGE_METRICS if view == "stages" else METRICS)


def plot(record: Record, path) -> None:
    """Requests/s per wire and client count."""
    from bench.harness.plot import bars

    bars(record, path, "req_s")
