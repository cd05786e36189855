"""KServe v2 over gRPC through Ray Serve's gRPC proxy, with the service tritonclient ships.

Ray Serve's proxy registers the servicer functions named in ``grpc_options`` when Serve starts
(:func:`grpc_options` names tritonclient's ``add_GRPCInferenceServiceServicer_to_server``) and
routes each call to the deployment's method of the RPC's name, with the request already
deserialized; with several applications the client names one in its ``application`` metadata.
:class:`KServeGrpc` is those methods: ``ModelInfer``, ``ModelMetadata``, ``ModelReady``,
``ModelStatistics`` (:mod:`~embedl_dynamo.serve.statistics`), ``ServerLive`` and
``ServerReady``; other RPCs of the service are not served. ``ModelInfer``
reads ``raw_input_contents`` (what ``tritonclient.grpc`` sends) with
:func:`~embedl_dynamo.serve.binary.tensor_from_bytes`, or the typed ``contents``, checks the
request as the HTTP route does (:func:`~embedl_dynamo.serve.kserve.decode_inputs`) and answers in
``raw_output_contents``. A request that does not fit the model is ``INVALID_ARGUMENT`` naming the
problem, another model's name ``NOT_FOUND``, the model's own failure ``INTERNAL``.

Ray pickles each request from the proxy to a replica, and tritonclient's messages name a module
no import finds; :func:`grpc_setup_hook` is the worker setup hook that lets it, and that also
binds the proxy's gRPC server to loopback (Ray binds it to ``[::]:port``, every interface,
whatever the node's address) for the local instance :func:`~embedl_dynamo.serve.deploy` starts
on loopback. tritonclient's stubs and grpc
are imported only where a call needs them (the ``serve`` extra).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from embedl_dynamo.errors import KServeError, error_line
from embedl_dynamo.serve.binary import tensor_bytes, tensor_from_bytes
from embedl_dynamo.serve.kserve import tensor_header
from embedl_dynamo.serve.statistics import InferenceStatistics

__all__ = ["GRPC_SERVICER", "KServeGrpc", "grpc_options", "grpc_setup_hook", "request_header"]

logger = logging.getLogger(__name__)

#: the servicer function Ray Serve's gRPC proxy registers (tritonclient's KServe v2 service)
GRPC_SERVICER = "tritonclient.grpc.service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"

# KServe v2 datatype -> the InferTensorContents field that holds it
_CONTENTS = {
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "BOOL": "bool_contents",
    "INT64": "int64_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def grpc_options(port: int) -> dict[str, Any]:
    """Ray Serve's ``grpc_options`` serving KServe v2 on ``port`` (``serve.start(grpc_options=
    ...)``; the Ray instance needs :func:`grpc_setup_hook` as its worker setup hook)."""
    return {"port": port, "grpc_servicer_functions": [GRPC_SERVICER]}


def grpc_setup_hook(loopback: bool = False) -> Callable[[], None]:
    """A ``worker_process_setup_hook`` for ``ray.init(runtime_env=...)`` that Serve's gRPC proxy
    and the replicas need to pass tritonclient's requests between them.

    tritonclient's generated messages name their module ``grpc_service_pb2``, which no import
    finds, so Ray could not pickle a ``ModelInferRequest`` from the proxy to a replica; the hook
    makes that name import ``tritonclient.grpc.service_pb2``. With ``loopback``, it also binds
    the proxy's gRPC server to ``127.0.0.1`` instead of ``[::]``, by wrapping the function Serve
    binds with. The hook runs in each worker process before any actor starts; it is a closure,
    so Ray ships it by value and a worker does not import this package (and PyTorch) to run it.
    """

    def setup_kserve_grpc() -> None:
        import sys

        try:
            from tritonclient.grpc import service_pb2
        except ImportError:
            return
        sys.modules.setdefault(service_pb2.ModelInferRequest.__module__, service_pb2)
        try:
            from ray.serve._private import default_impl
        except ImportError:
            return
        bind = getattr(default_impl, "add_grpc_address", None)
        if not loopback or bind is None or getattr(bind, "on_loopback", False):
            return

        def on_loopback(server: Any, address: str) -> Any:
            if address.startswith("[::]:"):
                address = "127.0.0.1:" + address.removeprefix("[::]:")
            return bind(server, address)

        on_loopback.on_loopback = True  # type: ignore[attr-defined]
        default_impl.add_grpc_address = on_loopback

    return setup_kserve_grpc


def _service() -> Any:
    try:
        from tritonclient.grpc import service_pb2
    except ImportError as exc:
        raise ImportError(
            f"KServe v2 gRPC needs tritonclient ({exc}); pip install 'tritonclient[grpc,http]>=2.40'"
        ) from exc
    return service_pb2


def _contents(tensor: Any, name: str, datatype: str) -> list[Any]:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise KServeError(f"input {name!r}: send {datatype} in raw_input_contents")
    return list(getattr(tensor.contents, field))


def request_header(request: Any) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """A ``ModelInferRequest`` as the HTTP route reads a request: its JSON header (outputs
    asked for as binary data, answered in ``raw_output_contents``) and the arrays of its
    ``raw_input_contents`` by input index.

    Raises:
        KServeError: raw contents that do not match the inputs, or a tensor that does not fit
            its own shape and datatype.
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise KServeError(
            f"the request has {len(raw)} raw_input_contents for {len(request.inputs)} inputs; "
            "send one per input, or none and typed contents"
        )
    inputs, binary = [], {}
    for index, tensor in enumerate(request.inputs):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
        }
        name, shape, datatype = tensor_header(entry, index)
        if raw:
            binary[index] = tensor_from_bytes(name, datatype, shape, raw[index])
        else:
            entry["data"] = _contents(tensor, name, datatype)
        inputs.append(entry)
    outputs = []
    for output in request.outputs:
        parameters: dict[str, Any] = {"binary_data": True}
        parameters.update({k: True for k in ("classification",) if k in output.parameters})
        outputs.append({"name": output.name, "parameters": parameters})
    header = {"inputs": inputs, "outputs": outputs, "parameters": {"binary_data_output": True}}
    return header, binary


def _fail(context: Any, code: str, message: str, empty: Any) -> Any:
    """Answer the call with gRPC status ``code`` and ``message`` (the reply itself is empty)."""
    import grpc

    if context is not None:
        context.set_code(getattr(grpc.StatusCode, code))
        context.set_details(message)
    return empty


class KServeGrpc:
    """The KServe v2 gRPC methods of a replica (mixed into
    :class:`~embedl_dynamo.serve.replica.Replica`, whose ``name``, ``model``, :meth:`metadata`
    and :meth:`respond` they use). Ray Serve passes the deserialized request and, to a method
    with a ``grpc_context`` argument, the call's context, which carries the status."""

    name: str
    model: Any
    statistics: InferenceStatistics

    def metadata(self) -> dict[str, Any]:  # the replica's
        raise NotImplementedError

    async def answered(self, decode: Callable[[], Any], encode: Callable[..., Any]) -> Any:
        raise NotImplementedError

    def kserve_arrays(self, header: Any, binary: Any) -> Any:
        raise NotImplementedError

    def kserve_parts(self, outputs: Any, arrays: Any, header: Any) -> Any:
        raise NotImplementedError

    async def ServerLive(self, request: Any, grpc_context: Any = None) -> Any:
        return _service().ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, grpc_context: Any = None) -> Any:
        return _service().ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:
        return _service().ModelReadyResponse(ready=request.name == self.name)

    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        service = _service()
        if request.name != self.name:
            message = f"no model {request.name!r}; this deployment serves {self.name!r}"
            return _fail(grpc_context, "NOT_FOUND", message, service.ModelMetadataResponse())
        fields = self.metadata()
        response = service.ModelMetadataResponse(
            name=fields["name"], versions=fields["versions"], platform=fields["platform"]
        )
        for side in ("inputs", "outputs"):
            for spec in fields[side]:
                getattr(response, side).add(
                    name=spec["name"], datatype=spec["datatype"], shape=spec["shape"]
                )
        return response

    async def ModelStatistics(self, request: Any, grpc_context: Any = None) -> Any:
        service = _service()
        if request.name not in ("", self.name) or request.version not in ("", "1"):
            asked = f"{request.name!r} version {request.version!r}"
            message = f"no model {asked}; this deployment serves {self.name!r} version '1'"
            return _fail(grpc_context, "NOT_FOUND", message, service.ModelStatisticsResponse())
        return self.statistics.to_grpc(service)

    async def ModelInfer(self, request: Any, grpc_context: Any = None) -> Any:
        service = _service()
        empty = service.ModelInferResponse()
        if (request.model_name, request.model_version or "1") != (self.name, "1"):
            asked = f"{request.model_name!r} version {request.model_version or '1'!r}"
            message = f"no model {asked}; this deployment serves {self.name!r} version '1'"
            return _fail(grpc_context, "NOT_FOUND", message, empty)

        def decode() -> Any:
            return self.kserve_arrays(*request_header(request))

        try:
            answer, raw = await self.answered(decode, self.kserve_parts)
        except (KServeError, ValueError, TypeError, IndexError) as exc:  # a bad request
            return _fail(grpc_context, "INVALID_ARGUMENT", str(exc), empty)
        except Exception as exc:  # noqa: BLE001 - the model's own failure, as a status
            logger.exception("%s: gRPC request failed", self.name)
            return _fail(grpc_context, "INTERNAL", f"the model failed: {error_line(exc)}", empty)
        response = service.ModelInferResponse(
            model_name=self.name, model_version="1", id=request.id
        )
        for entry in answer["outputs"]:
            response.outputs.add(
                name=entry["name"], datatype=entry["datatype"], shape=entry["shape"]
            )
        response.raw_output_contents.extend(bytes(tensor_bytes(array)) for array in raw)
        return response
