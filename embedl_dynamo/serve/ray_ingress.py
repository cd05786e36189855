"""The Ray Serve deployment class of a served file: a :class:`~embedl_dynamo.serve.replica.Replica`
behind Ray Serve's FastAPI ingress, with the KServe v2 HTTP routes.

Routes, the KServe v2 protocol Triton and OpenVINO Model Server speak (``tritonclient.http``
included): ``POST /v2/models/<name>[/versions/1]/infer`` (JSON, or binary tensor data:
:mod:`embedl_dynamo.serve.binary`; 400 naming the problem for a request the model cannot take,
500 marked ``"retry": false`` for the model's own failure), ``GET /v2/models/<name>``,
``GET /v2/models/<name>/ready``, ``GET /v2/models[/<name>[/versions/1]]/stats`` (the
statistics extension: :mod:`embedl_dynamo.serve.statistics`), ``GET /v2/health/ready`` and ``GET /v2/health/live``. The
replica's gRPC methods (:mod:`embedl_dynamo.serve.grpc_ingress`) are the class's own methods,
which Ray Serve's gRPC proxy calls by the RPC's name.

The class is defined on first use (:func:`deployment_class`): it needs Ray and FastAPI, which
are imported only then (the ``serve`` extra). Annotations are evaluated (no ``from __future__
import annotations``): FastAPI reads the routes' ``Request`` annotation, which exists only
inside :func:`deployment_class`.
"""

import functools
import logging
from typing import Any

from embedl_dynamo.errors import error_line
from embedl_dynamo.serve.binary import HEADER_LENGTH
from embedl_dynamo.serve.kserve import KServeError, response_bytes
from embedl_dynamo.serve.replica import Replica

__all__ = ["deployment_class", "is_loopback", "ray_modules"]

logger = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface."""
    return host in ("127.0.0.1", "localhost", "::1")


def ray_modules() -> tuple[Any, Any]:
    """``ray`` and ``ray.serve``, or an ImportError naming the extra that installs them."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ImportError(
            f"serving needs Ray Serve ({exc}); pip install 'ray[serve]>=2.40'"
        ) from exc
    return ray, serve


def _replica_grpc_on_loopback() -> None:
    """In a replica on a loopback-only node (the local instance :func:`deploy` starts), bind
    Serve's inter-deployment gRPC server to loopback too: Ray Serve (2.60) starts it on
    ``[::]:0``, every interface, whatever the node's address, with no option to change it. Its
    module's binding function is wrapped, once per replica process, before the replica starts
    the server; where that function is gone (another Ray), nothing changes."""
    import ray

    if not is_loopback(ray.util.get_node_ip_address()):
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


def _http_reply(body: bytes, header_length: int | None, status: int = 200) -> Any:
    from fastapi.responses import Response

    if header_length is None:
        return Response(body, status, media_type="application/json")
    headers = {HEADER_LENGTH: str(header_length)}
    return Response(body, status, headers=headers, media_type="application/octet-stream")


def _error(status: int, message: str, **extra: Any) -> Any:
    return _http_reply(response_bytes({"error": message, **extra}), None, status)


def _description(replica: Replica) -> dict[str, Any]:
    """A replica in a Ray Serve deployment: runtime, threads, batch limit, largest batch, Ray
    node and replica id."""
    import ray
    from ray import serve

    return {
        "model": replica.name,
        "runtime": replica.model.runtime,
        "threads": replica.model.threads,
        "max_batch_rows": replica.model.max_rows,
        "largest_batch": replica.model.largest_batch,
        "node_id": ray.get_runtime_context().get_node_id(),
        "replica": serve.get_replica_context().replica_id.unique_id,
    }


@functools.cache
def deployment_class() -> Any:
    """The ``@serve.deployment`` class (defined on first use: it needs Ray and FastAPI)."""
    _, serve = ray_modules()
    from fastapi import FastAPI, Request

    app = FastAPI(title="embedl_dynamo KServe v2")

    def reply(content: Any) -> Any:
        return _http_reply(response_bytes(content), None)

    @serve.deployment
    @serve.ingress(app)
    class EmbedlModel(Replica):
        def __init__(
            self,
            path: str,
            name: str,
            threads: int | None,
            max_batch: int | None,
            batch_wait_s: float,
        ) -> None:
            _replica_grpc_on_loopback()
            super().__init__(path, name, threads, max_batch, batch_wait_s)

        def describe(self) -> dict[str, Any]:
            """This replica: runtime, threads, batch limit, largest batch, Ray node, id."""
            return _description(self)

        @app.get("/v2/health/live")
        @app.get("/v2/health/ready")
        async def health(self):  # a replica exists once it answered check_answers' request
            return reply({"live": True, "ready": True})

        @app.get("/v2/models/stats")
        @app.get("/v2/models/{model}/stats")
        @app.get("/v2/models/{model}/versions/{version}/stats")
        async def model_statistics(self, model: str = "", version: str = ""):
            if model not in ("", self.name) or version not in ("", "1"):
                return _error(404, f"no model {model!r} version {version!r}")
            return reply(self.statistics.to_kserve())

        @app.get("/v2/models/{model}")
        @app.get("/v2/models/{model}/versions/{version}")
        async def model_metadata(self, model: str, version: str = "1"):
            if (model, version) != (self.name, "1"):
                return _error(404, f"no model {model!r} version {version!r}")
            return reply(self.metadata())

        @app.get("/v2/models/{model}/ready")
        @app.get("/v2/models/{model}/versions/{version}/ready")
        async def model_ready(self, model: str, version: str = "1"):
            if (model, version) != (self.name, "1"):
                return _error(404, f"no model {model!r} version {version!r}")
            return reply({"name": model, "ready": True})

        @app.post("/v2/models/{model}/infer")
        @app.post("/v2/models/{model}/versions/{version}/infer")
        async def infer_http(self, model: str, request: Request, version: str = "1"):
            if (model, version) != (self.name, "1"):
                served = f"this deployment serves {self.name!r} version '1'"
                return _error(404, f"no model {model!r} version {version!r}; {served}")
            headers = request.headers
            try:
                body, length = await self.infer_bytes(
                    await request.body(),
                    headers.get(HEADER_LENGTH),
                    headers.get("content-encoding"),
                )
            except (KServeError, ValueError, TypeError, IndexError) as exc:  # a bad request
                return _error(400, str(exc))
            except Exception as exc:  # the model's own failure: another try fails the same
                logger.exception("%s: request failed", self.name)
                return _error(500, f"the model failed: {error_line(exc)}", retry=False)
            return _http_reply(body, length)

    return EmbedlModel
