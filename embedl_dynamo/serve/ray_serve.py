"""An exported artifact as a Ray Serve deployment: replicas, request batching, KServe v2 over
HTTP (JSON and binary tensors) and gRPC.

Each replica loads the file with :func:`embedl_dynamo.load` (nothing is built), with its
runtime's threads set to the CPUs Ray gives it (``ray_actor_options={"num_cpus": n}``), so two
replicas on a two-core node run one thread each, and answers one request of zeros before it
counts as started (:class:`~embedl_dynamo.serve.replica.Replica`): a file no request could be
answered from fails the deployment instead of reporting ready. Requests are batched across
clients up to the rows the artifact takes at once (its dynamic batch axis; a file without one
runs each request alone) by :class:`~embedl_dynamo.serve.batcher.Batcher`, not
``@serve.batch``: a lone request runs at once, and the requests that arrive while a batch runs
form the next; a request the model refuses fails alone.

Requests arrive over HTTP (the KServe v2 routes of
:func:`~embedl_dynamo.serve.ray_ingress.deployment_class`: JSON for curl, binary tensor data for
``tritonclient.http``) and, with ``deploy(grpc_port=...)`` where it starts its own Ray instance
(Ray fixes the gRPC servicers when Serve starts), over gRPC: Ray Serve's gRPC proxy calls the
replica's KServe v2 methods (:mod:`embedl_dynamo.serve.grpc_ingress`), so
``tritonclient.grpc`` works unchanged.

In-cluster callers use the deployment handle :func:`deploy` returns:
``handle.infer.remote([array, ...]).result()`` gives what ``load()``'s module returns, numpy
arrays in place of tensors. :func:`deploy` starts a local Ray instance of its own unless given
a cluster's address, and :func:`undeploy` stops only what it started.

Ray is imported only inside these functions (the ``serve`` extra).
"""

import logging
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embedl_dynamo.deploy.sidecar_fields import check_threads
from embedl_dynamo.serve.artifact import check_artifact
from embedl_dynamo.serve.grpc_ingress import grpc_options, grpc_setup_hook
from embedl_dynamo.serve.objective import ServingChoice, choose_serving
from embedl_dynamo.serve.ray_ingress import deployment_class, is_loopback, ray_modules

__all__ = [
    "DEFAULT_BATCH_WAIT_S",
    "SERVE_LATENCY_SETTINGS",
    "build_app",
    "deploy",
    "model_name",
    "replica_plan",
    "serve_latency_env",
    "undeploy",
]

logger = logging.getLogger(__name__)

#: how long a batch with room waits for more requests: not at all (see Batcher)
DEFAULT_BATCH_WAIT_S = 0.0
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def model_name(path: str | os.PathLike[str], name: str | None = None) -> str:
    """The model's name in URLs: ``name``, else the file's stem; checked to be URL-safe."""
    name = name or Path(path).stem
    if not _NAME.match(name):
        raise ValueError(f"model name {name!r} must be letters, digits, '_', '-' or '.'")
    return name


def _ray() -> tuple[Any, Any]:
    return ray_modules()


def replica_plan(
    choice: ServingChoice, replicas: int, cpus_per_replica: float
) -> tuple[int, int, int, int]:
    """(replicas, CPUs per replica, threads per replica, batch rows) for ``choice``: the CPUs
    of ``replicas x cpus_per_replica`` re-split into replicas of ``choice.threads`` CPUs (one
    worker each, as measured), batches of ``choice.batch`` rows."""
    cpus = max(1, math.floor(cpus_per_replica))
    per_replica = min(choice.threads, cpus)
    return max(1, replicas * cpus // per_replica), per_replica, per_replica, choice.batch


def _check_sizes(replicas: int, max_batch_size: int | None, batch_wait_s: float) -> None:
    for label, value in (("replicas", replicas), ("max_batch_size", max_batch_size or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label}={value!r}: give an integer >= 1")
    if (
        isinstance(batch_wait_s, bool)
        or not isinstance(batch_wait_s, int | float)
        or not batch_wait_s >= 0
    ):
        raise ValueError(f"batch_wait_timeout_s={batch_wait_s!r}: give seconds >= 0")


def _plan_for_objective(
    path: Path,
    objective: str,
    latency_budget_ms: float | None,
    replicas: int,
    cpus_per_replica: float,
) -> tuple[int, int, int, int]:
    """``(replicas, cpus_per_replica, threads, max_batch_size)`` for ``objective``: the batch
    and threads :func:`~embedl_dynamo.serve.objective.choose_serving` measures here on one
    replica's whole CPUs, spread by :func:`replica_plan` over the CPUs asked for in all."""
    choice = choose_serving(
        path,
        objective=objective,
        latency_budget_ms=latency_budget_ms,
        cpus=max(1, math.floor(cpus_per_replica)),
    )
    logger.info(
        "%s: %s (batch %d, %d thread(s) per replica)",
        path.name,
        choice.note,
        choice.batch,
        choice.threads,
    )
    return replica_plan(choice, replicas, cpus_per_replica)


def _deployment_options(
    name: str,
    replicas: int,
    cpus_per_replica: float,
    max_batch_size: int | None,
    autoscaling: Mapping[str, Any] | None,
    deployment_options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Ray Serve's ``Deployment.options``: those :func:`build_app`'s arguments set, and the
    caller's ``deployment_options``, which may not set any of them again."""
    scaling: dict[str, Any] = (
        {"autoscaling_config": dict(autoscaling)} if autoscaling else {"num_replicas": replicas}
    )
    ours = {
        "name": name,
        "ray_actor_options": {"num_cpus": cpus_per_replica},
        "max_ongoing_requests": 2 * (max_batch_size or 8),
        **scaling,
    }
    taken = sorted(set(deployment_options or {}) & {*ours, "num_replicas", "autoscaling_config"})
    if taken:
        raise ValueError(
            f"deployment_options sets {taken}, which build_app's own arguments "
            "set (name, replicas, cpus_per_replica, max_batch_size, autoscaling)"
        )
    return {**ours, **(deployment_options or {})}


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
        batch_wait_timeout_s: how long a batch that has room waits for more requests (default
            0: a lone request runs at once; requests that arrive while a batch runs form the
            next batch whatever this is).
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
    _check_sizes(replicas, max_batch_size, batch_wait_timeout_s)
    if objective is not None:
        replicas, cpus_per_replica, threads, max_batch_size = _plan_for_objective(
            path, objective, latency_budget_ms, replicas, cpus_per_replica
        )
    if threads is None:
        threads = max(1, math.floor(cpus_per_replica))
    check_threads(threads, "threads")  # as each replica's load() would, before any starts
    options = _deployment_options(
        name, replicas, cpus_per_replica, max_batch_size, autoscaling, deployment_options
    )
    deployment = deployment_class().options(**options)
    return deployment.bind(str(path), name, threads, max_batch_size, batch_wait_timeout_s)


class _Started:
    """What :func:`deploy` started in this process: a local Ray instance (with Serve), and the
    applications it deployed there (:func:`undeploy` shuts the instance down with the last)."""

    ray = False
    apps: set[str] = set()
    grpc_port: int | None = None  # Serve's gRPC port on the instance deploy started


def _check_grpc(ray: Any, address: str | None, grpc_port: int | None) -> None:
    """gRPC is offered where :func:`deploy` starts Serve itself (Ray reads the gRPC
    servicers when Serve starts, never after), and on the port it started it with."""
    if grpc_port is None:
        return
    if isinstance(grpc_port, bool) or not isinstance(grpc_port, int) or grpc_port < 1:
        raise ValueError(f"grpc_port={grpc_port!r}: give a port number >= 1")
    if _Started.ray and _Started.grpc_port == grpc_port:
        return
    fresh = address is None and not ray.is_initialized()
    if not fresh:
        raise ValueError(
            f"grpc_port={grpc_port}: Ray Serve fixes its gRPC servicers when it starts, so "
            "deploy() offers gRPC only on the Ray instance it starts itself (no address, no "
            "ray.init() before it); elsewhere start Serve with grpc_options="
            "embedl_dynamo.serve.grpc_options(port) before the first deploy()"
        )


#: Ray Serve's own settings for a request's path, in the local instance :func:`deploy` starts:
#: the proxy reaches a replica over gRPC rather than Ray's actor calls, the replica runs the
#: request's code and its router on its own event loop rather than a loop in another thread
#: (every handler here is async and runs the model off the loop), and request logs are
#: buffered. They are the parts of Serve's ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` mode that keep
#: its proxy (that mode's direct ingress fixes ports 8000 and 9000 and one application).
SERVE_LATENCY_SETTINGS = {
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
}


def serve_latency_env() -> dict[str, str]:
    """The environment of the local Ray instance :func:`deploy` starts:
    :data:`SERVE_LATENCY_SETTINGS`, each unless this process's environment sets it already (the
    caller's choice wins).

    Example:
        >>> serve_latency_env()["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"]  # doctest: +SKIP
        '0'
    """
    return {k: v for k, v in SERVE_LATENCY_SETTINGS.items() if k not in os.environ}


def _start_ray(ray: Any, address: str | None, host: str, grpc: bool = False) -> None:
    """Connect to ``address``, or start a fresh local Ray instance (never one found running:
    ``address="local"`` ignores ``RAY_ADDRESS`` and ``ray start``'s cluster), its own ports on
    loopback where the HTTP proxy is (Ray's single-machine mode, asked for before Ray is
    imported); with ``grpc``, the worker setup hook Serve's gRPC proxy needs (its server on
    loopback too)."""
    if ray.is_initialized():  # the caller's own ray.init(): theirs to shut down
        return
    quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address is None:
        quiet["runtime_env"] = {"env_vars": serve_latency_env()}
        if grpc:
            hook = grpc_setup_hook(loopback=is_loopback(host))
            quiet["runtime_env"]["worker_process_setup_hook"] = hook
    ray.init(address=address or "local", include_dashboard=False, **quiet)
    if address is None:
        _Started.ray = True
        node = ray.util.get_node_ip_address()
        if is_loopback(host) and not is_loopback(node):
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
    grpc_port: int | None = None,
    route_prefix: str | None = "/",
    **options: Any,
) -> Any:
    """Serve ``path`` on Ray Serve over HTTP (and gRPC) and return the deployment's handle.

    Checks the file first (:func:`build_app`), then connects to the Ray cluster at
    ``address``, or, without one, starts a fresh local Ray instance of its own (a cluster
    already running on the machine, or named by ``RAY_ADDRESS``, is not joined), whose ports
    listen on loopback alone while ``host`` is loopback; a process that called ``ray.init``
    itself keeps its instance. Then starts Serve's HTTP proxy on ``host:port`` (the head node
    only, by default: on one machine a proxy per node would contend for the port) and deploys
    :func:`build_app`. With ``grpc_port``, Serve's gRPC proxy speaks KServe v2 there too
    (``tritonclient.grpc``; loopback alone while ``host`` is). :func:`undeploy` stops what
    this started, and only that.

    Args:
        path: the exported ``.onnx`` file.
        host, port: where the HTTP proxy listens (Serve's first start fixes them).
        address: a Ray cluster address (``ray://...`` or ``host:port``) to join; None starts
            a local instance.
        proxy_location: Serve's ``proxy_location`` (``HeadOnly``, ``EveryNode``).
        name: the model's name (and the Serve application's; a gRPC client names it in its
            ``application`` metadata where several run).
        grpc_port: where Serve's gRPC proxy listens; only where this call starts the Ray
            instance (or an earlier call started it with the same port).
        route_prefix: Serve's route prefix for the application (``/``: the KServe routes as
            they are). A second application in the instance needs a prefix of its own (such as
            ``/second``, its HTTP routes below it); gRPC clients reach it by its name in the
            ``application`` metadata. None: the handle alone (Serve's gRPC proxy routes only
            to applications with a prefix).
        options: :func:`build_app`'s options (``replicas``, ``cpus_per_replica``, ...).

    Returns:
        A ``DeploymentHandle``: ``handle.infer.remote([array, ...]).result()`` gives what
        ``load()``'s module returns (its structure; numpy arrays in place of tensors).

    Raises:
        ValueError: a bad option (``grpc_port`` where Serve runs already without it), or a
            file ``load()`` would refuse (before Ray starts).
        RuntimeError: the replicas did not start (one cannot answer: the reason is Serve's
            message); a local instance this started is shut down again.
    """
    if address is None and is_loopback(host) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray: loopback only
    name = model_name(path, name)
    app = build_app(path, name=name, **options)
    ray, serve = _ray()
    _check_grpc(ray, address, grpc_port)
    _start_ray(ray, address, host, grpc=grpc_port is not None)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    start: dict[str, Any] = {"http_options": {"host": host, "port": port}}
    if grpc_port is not None:
        start["grpc_options"] = grpc_options(grpc_port)
    try:
        serve.start(proxy_location=proxy_location, logging_config=quiet, **start)
        if _Started.ray and grpc_port is not None:
            _Started.grpc_port = grpc_port
        handle = serve.run(app, name=name, route_prefix=route_prefix, logging_config=quiet)
    except BaseException:
        if _Started.ray and not _Started.apps:  # nothing else of ours runs there
            undeploy(name)
        raise
    if _Started.ray:
        _Started.apps.add(name)
    if route_prefix is not None:
        base = f"http://{host}:{port}{route_prefix.rstrip('/')}"
        logger.info("serving %s at %s/v2/models/%s", path, base, name)
    if grpc_port is not None:
        logger.info("serving %s over gRPC at %s:%s (application %s)", path, host, grpc_port, name)
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
        _Started.ray, _Started.grpc_port = False, None
        return
    if name in serve.status().applications:
        serve.delete(name)
