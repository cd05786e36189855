"""An exported artifact as a Ray Serve deployment: replicas, request batching, KServe v2 over HTTP.

Each replica loads the file with :func:`embedl_dynamo.load` (nothing is built), with its
runtime's threads set to the CPUs Ray gives it (``ray_actor_options={"num_cpus": n}``), so two
replicas on a two-core node run one thread each, and answers one request of zeros before it
counts as started (:class:`~embedl_dynamo.serve.replica.Replica`): a file no request could be
answered from fails the deployment instead of reporting ready. Requests are batched across
clients with ``@serve.batch`` up to the rows the artifact takes at once (its dynamic batch
axis; a file without one runs each request alone), waiting at most ``batch_wait_timeout_s``;
a request the model refuses fails alone.

Routes (Ray Serve's FastAPI ingress), the KServe v2 protocol Triton and OpenVINO Model Server
speak, so one client works against any of them:

* ``POST /v2/models/<name>/infer``: JSON inference (:mod:`embedl_dynamo.serve.kserve`): 400
  naming the problem for a request the model cannot take, 500 marked ``"retry": false`` for
  the model's own failure;
* ``GET /v2/models/<name>``: the model's inputs and outputs (named by the output structure,
  :mod:`embedl_dynamo.serve.outputs`); ``GET /v2/models/<name>/ready``;
* ``GET /v2/health/ready`` and ``GET /v2/health/live``.

In-cluster callers use the deployment handle :func:`deploy` returns:
``handle.infer.remote([array, ...]).result()`` gives what ``load()``'s module returns, numpy
arrays in place of tensors. :func:`deploy` starts a local Ray instance of its own unless given
a cluster's address, and :func:`undeploy` stops only what it started.

Ray is imported only inside these functions (the ``serve`` extra). Annotations are evaluated
(no ``from __future__ import annotations``): FastAPI reads the routes' ``Request`` annotation,
which exists only inside :func:`_deployment_class`.
"""

import functools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from embedl_dynamo.deploy.sidecar_fields import check_threads
from embedl_dynamo.errors import error_line
from embedl_dynamo.serve.artifact import Outcome, check_artifact
from embedl_dynamo.serve.kserve import KServeError, response_bytes
from embedl_dynamo.serve.objective import ServingChoice, choose_serving
from embedl_dynamo.serve.replica import Replica

__all__ = [
    "DEFAULT_BATCH_WAIT_S",
    "build_app",
    "deploy",
    "model_name",
    "replica_plan",
    "undeploy",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_WAIT_S = 0.005
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def model_name(path: str | os.PathLike[str], name: str | None = None) -> str:
    """The model's name in URLs: ``name``, else the file's stem; checked to be URL-safe."""
    name = name or Path(path).stem
    if not _NAME.match(name):
        raise ValueError(f"model name {name!r} must be letters, digits, '_', '-' or '.'")
    return name


def _ray() -> tuple[Any, Any]:
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ImportError(
            f"serving needs Ray Serve ({exc}); pip install 'embedl-dynamo[serve]'"
        ) from exc
    return ray, serve


def _replica_grpc_on_loopback() -> None:
    """In a replica on a loopback-only node (the local instance :func:`deploy` starts), bind
    Serve's inter-deployment gRPC server to loopback too: Ray Serve (2.60) starts it on
    ``[::]:0``, every interface, whatever the node's address, with no option to change it. Its
    module's binding function is wrapped, once per replica process, before the replica starts
    the server; where that function is gone (another Ray), nothing changes."""
    import ray

    if not _loopback(ray.util.get_node_ip_address()):
        return
    try:
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return
    bind = getattr(serve_replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "on_loopback", False):
        return

    def on_loopback(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.removeprefix("[::]:")
        return bind(server, address)

    on_loopback.on_loopback = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = on_loopback


def _rows(items: list[tuple[int, list[np.ndarray]]]) -> int:
    return sum(rows for rows, _ in items)


@functools.cache
def _deployment_class() -> Any:
    """The ``@serve.deployment`` class (defined on first use: it needs Ray and FastAPI)."""
    _, serve = _ray()
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    app = FastAPI(title="embedl_dynamo KServe v2")

    def reply(content: Any, status: int = 200) -> Response:
        return Response(response_bytes(content), status, media_type="application/json")

    def error(status: int, message: str, **extra: Any) -> Response:
        return reply({"error": message, **extra}, status)

    @serve.deployment
    @serve.ingress(app)
    class EmbedlModel(Replica):
        def __init__(self, path: str, name: str, threads: int | None, max_batch: int | None,
                     batch_wait_s: float) -> None:  # fmt: skip
            _replica_grpc_on_loopback()
            super().__init__(path, name, threads, max_batch)
            self.infer_batch.set_max_batch_size(self.model.max_rows)
            self.infer_batch.set_batch_wait_timeout_s(batch_wait_s)

        @serve.batch(max_batch_size=1, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S,
                     batch_size_fn=_rows)  # fmt: skip
        async def infer_batch(self, items: list[tuple[int, list[np.ndarray]]]):
            return await self.run_all(items)

        async def run_one(self, rows: int, arrays: list[np.ndarray]) -> Outcome:
            return await self.infer_batch((rows, arrays))

        def describe(self) -> dict[str, Any]:
            """This replica: runtime, threads, batch limit, largest batch, Ray node, id."""
            import ray

            return {
                "model": self.name,
                "runtime": self.model.runtime,
                "threads": self.model.threads,
                "max_batch_rows": self.model.max_rows,
                "largest_batch": self.model.largest_batch,
                "node_id": ray.get_runtime_context().get_node_id(),
                "replica": serve.get_replica_context().replica_id.unique_id,
            }

        @app.get("/v2/health/live")
        @app.get("/v2/health/ready")
        async def health(self):  # a replica exists once it answered check_answers' request
            return reply({"live": True, "ready": True})

        @app.get("/v2/models/{model}")
        async def model_metadata(self, model: str):
            return (
                reply(self.metadata()) if model == self.name else error(404, f"no model {model!r}")
            )

        @app.get("/v2/models/{model}/ready")
        async def model_ready(self, model: str):
            return (
                reply({"name": model, "ready": True}) if model == self.name else error(404, model)
            )

        @app.post("/v2/models/{model}/infer")
        async def infer_http(self, model: str, request: Request):
            if model != self.name:
                return error(404, f"no model {model!r}; this deployment serves {self.name!r}")
            try:
                body = json.loads(await request.body())
            except (ValueError, RecursionError) as exc:
                return error(400, f"the request body is not JSON ({error_line(exc)})")
            try:
                return reply(await self.infer_json(body))
            except (KServeError, ValueError, TypeError) as exc:  # a bad request, or refused
                return error(400, str(exc))
            except Exception as exc:  # the model's own failure: another try fails the same
                logger.exception("%s: request failed", self.name)
                return error(500, f"the model failed: {error_line(exc)}", retry=False)

    return EmbedlModel


def replica_plan(
    choice: ServingChoice, replicas: int, cpus_per_replica: float
) -> tuple[int, int, int, int]:
    """(replicas, CPUs per replica, threads per replica, batch rows) for ``choice``: the CPUs
    of ``replicas x cpus_per_replica`` re-split into replicas of ``choice.threads`` CPUs (one
    worker each, as measured), batches of ``choice.batch`` rows."""
    cpus = max(1, math.floor(cpus_per_replica))
    per_replica = min(choice.threads, cpus)
    return max(1, replicas * cpus // per_replica), per_replica, per_replica, choice.batch


def build_app(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    replicas: int = 1,
    cpus_per_replica: float = 1,
    threads: int | None = None,
    max_batch_size: int | None = None,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_S,
    autoscaling: Mapping[str, Any] | None = None,
    objective: str | None = None,
    latency_budget_ms: float | None = None,
    deployment_options: Mapping[str, Any] | None = None,
) -> Any:
    """The Ray Serve application serving ``path`` (for ``serve.run`` or a Serve config).

    Args:
        path: the ``.onnx`` file :func:`~embedl_dynamo.export` wrote; every node that may run a
            replica must see it at this path (shared storage, or the same copy on each node).
        name: the model's name in URLs (default: the file's stem).
        replicas: replicas to run (without ``autoscaling``).
        cpus_per_replica: the CPUs Ray reserves for each replica.
        threads: the runtime's threads per replica (default: ``cpus_per_replica``, at least 1).
        max_batch_size: the most rows one batch holds (default 8; 1 for a file without a
            dynamic batch axis).
        batch_wait_timeout_s: how long a batch waits for more requests.
        autoscaling: Ray Serve's ``autoscaling_config`` (``{"min_replicas": 1,
            "max_replicas": 4}``, ...); it replaces ``replicas``.
        objective: ``latency`` (batches of one row, every CPU of a replica on it) or
            ``throughput`` (:func:`~embedl_dynamo.serve.objective.choose_serving` measures the
            file here, on ``cpus_per_replica`` CPUs, and its batch and threads per worker
            become the batch limit and the CPUs per replica; the CPUs in all stay
            ``replicas x cpus_per_replica``); None: the options as given.
        latency_budget_ms: the p99 a batch may take under ``objective="throughput"``.
        deployment_options: more of Ray Serve's ``Deployment.options`` (such as
            ``health_check_period_s``, ``graceful_shutdown_timeout_s``); not those the
            arguments above set.

    Returns:
        A bound ``ray.serve.Application``.

    Raises:
        ValueError: a bad option, or a file ``load()`` would refuse (changed since export, a
            sidecar field out of bounds, not ONNX), checked here before any replica starts.
    """
    path = Path(path).resolve()
    name = model_name(path, name)
    if not path.is_file():
        raise FileNotFoundError(f"no artifact at {str(path)!r}; export one first")
    check_artifact(path)  # a changed or garbage file is refused here, not by every replica
    for label, value in (("replicas", replicas), ("max_batch_size", max_batch_size or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label}={value!r}: give an integer >= 1")
    if objective is not None:
        choice = choose_serving(path, objective=objective, latency_budget_ms=latency_budget_ms,
                                cpus=max(1, math.floor(cpus_per_replica)))  # fmt: skip
        logger.info("%s: %s (batch %d, %d thread(s) per replica)", path.name, choice.note,
                    choice.batch, choice.threads)  # fmt: skip
        replicas, cpus_per_replica, threads, max_batch_size = replica_plan(
            choice, replicas, cpus_per_replica
        )
    if threads is None:
        threads = max(1, math.floor(cpus_per_replica))
    check_threads(threads, "threads")  # as each replica's load() would, before any starts
    scaling: dict[str, Any] = (
        {"autoscaling_config": dict(autoscaling)} if autoscaling else {"num_replicas": replicas}
    )
    ours = {"name": name, "ray_actor_options": {"num_cpus": cpus_per_replica},
            "max_ongoing_requests": 2 * (max_batch_size or 8), **scaling}  # fmt: skip
    taken = sorted(set(deployment_options or {}) & {*ours, "num_replicas", "autoscaling_config"})
    if taken:
        raise ValueError(
            f"deployment_options sets {taken}, which build_app's own arguments "
            "set (name, replicas, cpus_per_replica, max_batch_size, autoscaling)"
        )
    deployment = _deployment_class().options(**ours, **(deployment_options or {}))
    return deployment.bind(str(path), name, threads, max_batch_size, batch_wait_timeout_s)


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


class _Started:
    """What :func:`deploy` started in this process: a local Ray instance (with Serve), and the
    applications it deployed there (:func:`undeploy` shuts the instance down with the last)."""

    ray = False
    apps: set[str] = set()


def _start_ray(ray: Any, address: str | None, host: str) -> None:
    """Connect to ``address``, or start a fresh local Ray instance (never one found running:
    ``address="local"`` ignores ``RAY_ADDRESS`` and ``ray start``'s cluster), its own ports on
    loopback where the HTTP proxy is (Ray's single-machine mode, asked for before Ray is
    imported)."""
    if ray.is_initialized():  # the caller's own ray.init(): theirs to shut down
        return
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    ray.init(address=address or "local", include_dashboard=False, **quiet)
    if address is None:
        _Started.ray = True
        node = ray.util.get_node_ip_address()
        if _loopback(host) and not _loopback(node):
            logger.warning(
                "Ray's own ports listen on %s, not only on loopback: Ray was imported before "
                "deploy(); set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing it",
                node,
            )


def deploy(
    path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    proxy_location: str = "HeadOnly",
    name: str | None = None,
    **options: Any,
) -> Any:
    """Serve ``path`` on Ray Serve over HTTP and return the deployment's handle.

    Checks the file first (:func:`build_app`), then connects to the Ray cluster at
    ``address``, or, without one, starts a fresh local Ray instance of its own (a cluster
    already running on the machine, or named by ``RAY_ADDRESS``, is not joined), whose ports
    listen on loopback alone while ``host`` is loopback; a process that called ``ray.init``
    itself keeps its instance. Then starts Serve's HTTP proxy on ``host:port`` (the head node
    only, by default: on one machine a proxy per node would contend for the port) and deploys
    :func:`build_app`. :func:`undeploy` stops what this started, and only that.

    Args:
        path: the exported ``.onnx`` file.
        host, port: where the HTTP proxy listens (Serve's first start fixes them).
        address: a Ray cluster address (``ray://...`` or ``host:port``) to join; None starts
            a local instance.
        proxy_location: Serve's ``proxy_location`` (``HeadOnly``, ``EveryNode``).
        name: the model's name (and the Serve application's).
        options: :func:`build_app`'s options (``replicas``, ``cpus_per_replica``, ...).

    Returns:
        A ``DeploymentHandle``: ``handle.infer.remote([array, ...]).result()`` gives what
        ``load()``'s module returns (its structure; numpy arrays in place of tensors).

    Raises:
        ValueError: a bad option, or a file ``load()`` would refuse (before Ray starts).
        RuntimeError: the replicas did not start (one cannot answer: the reason is Serve's
            message); a local instance this started is shut down again.
    """
    if address is None and _loopback(host) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray: loopback only
    name = model_name(path, name)
    app = build_app(path, name=name, **options)
    ray, serve = _ray()
    _start_ray(ray, address, host)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    try:
        serve.start(http_options={"host": host, "port": port}, proxy_location=proxy_location,
                    logging_config=quiet)  # fmt: skip
        handle = serve.run(app, name=name, route_prefix="/", logging_config=quiet)
    except BaseException:
        if _Started.ray and not _Started.apps:  # nothing else of ours runs there
            undeploy(name)
        raise
    if _Started.ray:
        _Started.apps.add(name)
    logger.info("serving %s at http://%s:%s/v2/models/%s", path, host, port, name)
    return handle


def undeploy(name: str) -> None:
    """Stop what :func:`deploy` started for the application ``name``, and nothing else: the
    application; and, where ``deploy`` started the local Ray instance and no other application
    it deployed runs there, Serve and that instance. In a cluster it joined, other
    applications, Serve and Ray keep running."""
    ray, serve = _ray()
    if not ray.is_initialized():
        return
    _Started.apps.discard(name)
    if _Started.ray and not _Started.apps:
        serve.shutdown()
        ray.shutdown()
        _Started.ray = False
        return
    if name in serve.status().applications:
        serve.delete(name)
