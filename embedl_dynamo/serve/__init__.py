"""Serving an exported artifact: a Ray Serve deployment speaking the KServe v2 protocol.

:func:`deploy` serves an ``.onnx`` file :func:`embedl_dynamo.export` wrote on a Ray cluster (one
machine or many, or a local instance of its own): replicas that each start from the file
without building, requests batched across clients, ``POST /v2/models/<name>/infer`` over HTTP
(JSON for curl, binary tensor data for ``tritonclient.http``), KServe v2 gRPC
(``tritonclient.grpc``) where it starts its own Ray instance, and a Python handle that returns
the model's output structure; :func:`undeploy` stops only what
``deploy`` started; :func:`choose_serving` picks the batch size and threads per replica for
``objective="throughput"`` (within a latency budget) by measuring the file on this machine.
Triton model repositories are written at export time (:mod:`embedl_dynamo.deploy.triton`). Ray
is imported only when a deployment is built: the ``serve`` extra (``pip install -e '.[serve]'``
in a clone), or ``pip install 'ray[serve]>=2.40' 'tritonclient[grpc,http]>=2.40'``.
"""

from embedl_dynamo.serve.artifact import ServedArtifact, check_artifact
from embedl_dynamo.serve.client import decode_outputs, infer_request, post_infer
from embedl_dynamo.serve.grpc_ingress import GRPC_SERVICER, grpc_options
from embedl_dynamo.serve.kserve import KServeError
from embedl_dynamo.serve.objective import ServingChoice, choose_serving, write_triton_for_objective
from embedl_dynamo.serve.outputs import ServedOutputs
from embedl_dynamo.serve.ray_serve import SERVE_LATENCY_SETTINGS, build_app, deploy, undeploy
from embedl_dynamo.serve.replica import Replica
from embedl_dynamo.serve.statistics import InferenceStatistics

__all__ = [
    "GRPC_SERVICER",
    "InferenceStatistics",
    "KServeError",
    "SERVE_LATENCY_SETTINGS",
    "Replica",
    "ServedArtifact",
    "ServedOutputs",
    "ServingChoice",
    "build_app",
    "check_artifact",
    "choose_serving",
    "decode_outputs",
    "deploy",
    "grpc_options",
    "infer_request",
    "post_infer",
    "undeploy",
    "write_triton_for_objective",
]
