"""Ray Serve answering tritonclient over binary HTTP and gRPC, run as its own process.

``python -m tests.serve.wire_scenario WORKDIR`` exports a model with float and int64 inputs that
returns a dict, deploys it with :func:`embedl_dynamo.serve.deploy` on a local Ray instance of
its own with gRPC (``grpc_port``) and a second application beside it (``route_prefix="/second"``),
then sends requests with ``tritonclient.http`` (binary data, and
JSON), ``tritonclient.grpc`` (naming each application in its ``application`` metadata), the
package's JSON client and malformed bodies, and reads the replica's inference statistics with
both clients; it compares every answer with
:func:`embedl_dynamo.load` in this process, records the TCP sockets its Ray processes listen on,
and prints one JSON line with what it saw. ``tests/serve/test_ray_wire.py`` runs it under a time
limit and kills its process group if it overruns.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from embedl_dynamo import export, load  # noqa: E402
from embedl_dynamo.serve import decode_outputs, deploy, infer_request, post_infer, undeploy  # noqa: E402
from tests.serve.processes import descendants, free_port, listening  # noqa: E402


class Mixed(nn.Module):
    """Float features and int64 token ids in; a dict with a float, an int64 and a None out."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.embed = nn.Linear(4, 3), nn.Embedding(10, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor):
        logits = self.proj(x) + self.embed(ids).sum(1)
        return {"logits": logits, "extra": (logits.relu(), ids * 2), "none": None}


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _bad_requests(url: str, x: np.ndarray) -> dict[str, list]:
    """HTTP status and error of binary bodies that do not add up, and of a datatype not served."""
    entry = {
        "name": "input_0",
        "shape": [1, 4],
        "datatype": "FP32",
        "parameters": {"binary_data_size": 16},
    }
    ids = {"name": "input_1", "shape": [1, 5], "datatype": "INT64", "data": [1, 2, 3, 4, 5]}
    cases = {
        "short": ({"inputs": [entry, ids]}, x[:1].tobytes()[:12]),
        "extra": ({"inputs": [entry, ids]}, x[:1].tobytes() + b"\0\0"),
        "bf16": (
            {"inputs": [{**entry, "datatype": "BF16", "parameters": {"binary_data_size": 8}}, ids]},
            bytes(8),
        ),
    }
    seen = {}
    for label, (header, tail) in cases.items():
        text = json.dumps(header).encode()
        headers = {"Inference-Header-Content-Length": str(len(text))}
        status, body = _post(url, text + tail, headers)
        seen[label] = [status, body.get("error", "")]
    return seen


def _http(port: int, x: np.ndarray, ids: np.ndarray, expected: dict) -> dict:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [
        httpclient.InferInput("input_0", list(x.shape), "FP32"),
        httpclient.InferInput("input_1", list(ids.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(x, binary_data=True)
    inputs[1].set_data_from_numpy(ids, binary_data=True)
    asked = [httpclient.InferRequestedOutput(name, binary_data=True) for name in expected]
    result = client.infer("mixed", inputs, outputs=asked)
    default = client.infer("mixed", inputs)  # no outputs named: all binary (binary_data_output)
    return {
        "live": client.is_server_live(),
        "ready": client.is_model_ready("mixed"),
        "metadata_outputs": [o["name"] for o in client.get_model_metadata("mixed")["outputs"]],
        "binary_equal": all(np.array_equal(result.as_numpy(n), w) for n, w in expected.items()),
        "binary_dtypes": [str(result.as_numpy(n).dtype) for n in expected],
        "default_equal": all(np.array_equal(default.as_numpy(n), w) for n, w in expected.items()),
    }


def _grpc(port: int, x: np.ndarray, ids: np.ndarray, expected: dict) -> dict:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [
        grpcclient.InferInput("input_0", list(x.shape), "FP32"),
        grpcclient.InferInput("input_1", list(ids.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(ids)
    seen: dict = {}
    for app in ("mixed", "second"):
        headers = {"application": app}
        result = client.infer(app, inputs, headers=headers)
        seen[f"{app}_equal"] = all(
            np.array_equal(result.as_numpy(n), w) for n, w in expected.items()
        )
        seen[f"{app}_metadata"] = client.get_model_metadata(app, headers=headers).name
        seen[f"{app}_ready"] = client.is_model_ready(app, headers=headers)
    seen["live"] = client.is_server_live(headers={"application": "mixed"})
    bad = [grpcclient.InferInput("input_0", [3, 3], "FP32"), inputs[1]]
    bad[0].set_data_from_numpy(x[:, :3].copy())
    try:
        client.infer("mixed", bad, headers={"application": "mixed"})
        seen["bad"] = None
    except InferenceServerException as exc:
        seen["bad"] = [exc.status(), exc.message()]
    return seen


def _statistics(port: int, grpc_port: int) -> dict:
    """The "mixed" replica's request counts as tritonclient reads them over HTTP and gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    (entry,) = http.get_inference_statistics("mixed")["model_stats"]
    everything = http.get_inference_statistics()["model_stats"]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    reply = grpc.get_inference_statistics("mixed", headers={"application": "mixed"})
    stats = entry["inference_stats"]
    return {
        "http": [stats["success"]["count"], stats["fail"]["count"], entry["inference_count"]],
        "http_all": [e["name"] for e in everything],
        "grpc": [
            reply.model_stats[0].inference_stats.success.count,
            reply.model_stats[0].inference_stats.fail.count,
            reply.model_stats[0].inference_count,
        ],
        "stages_ns": [stats[s]["ns"] for s in ("queue", "compute_input", "compute_infer")],
    }


def main(workdir: Path) -> None:
    torch.manual_seed(0)
    example = (torch.randn(2, 4), torch.randint(0, 10, (2, 5)))
    options = {"cache_dir": workdir / "cache"}
    path = export(
        Mixed().eval(),
        example,
        workdir / "mixed.onnx",
        backend="onnxruntime",
        progress=False,
        options=options,
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ids = rng.integers(0, 10, (3, 5)).astype(np.int64)
    with torch.no_grad():
        want = load(path)(torch.from_numpy(x), torch.from_numpy(ids))
    expected = {
        "logits": want["logits"].numpy(),
        "extra.0": want["extra"][0].numpy(),
        "extra.1": want["extra"][1].numpy(),
    }
    port, grpc_port = free_port(), free_port()
    seen: dict = {}
    try:
        deploy(path, name="mixed", port=port, grpc_port=grpc_port, cpus_per_replica=0.5)
        deploy(
            path, name="second", grpc_port=grpc_port, route_prefix="/second", cpus_per_replica=0.5
        )
        url = f"http://127.0.0.1:{port}/v2/models/mixed/infer"
        seen["http"] = _http(port, x, ids, expected)
        seen["grpc"] = _grpc(grpc_port, x, ids, expected)
        response, _ = post_infer(url, infer_request([x, ids], ["input_0", "input_1"]))
        got = decode_outputs(response)
        seen["json_equal"] = all(np.array_equal(got[n], w) for n, w in expected.items())
        seen["bad"] = _bad_requests(url, x)
        seen["statistics"] = _statistics(port, grpc_port)
        seen["sockets"] = listening(descendants(os.getpid()))
        seen["ports"] = [port, grpc_port]
    finally:
        undeploy("second")
        undeploy("mixed")
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
