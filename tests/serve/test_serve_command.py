"""``embedl-dynamo serve``: a changed or garbage file is refused with exit 2 before Ray starts;
a real run (slow) starts its own local Ray instance on loopback although ``RAY_ADDRESS`` names
another cluster, serves a model returning a dict with ``None`` over KServe v2 JSON, answers a
bad request with 400, and shuts down everything it started on Ctrl-C."""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import embedl_dynamo.serve
from embedl_dynamo import export, load
from embedl_dynamo.cli.main import main
from embedl_dynamo.deploy.sidecar import sidecar_path
from embedl_dynamo.serve.client import decode_outputs, infer_request, post_infer
from embedl_dynamo.serve.kserve import KServeError
from tests.serve.processes import alive, descendants, free_port, listening

ROOT = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 150


class _Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor):
        y = self.proj(x)
        return {"logits": y, "past_key_values": ((y.relu(), y * 2),), "aux": None}


@pytest.fixture(scope="module")
def structured(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("serve_command")
    options = {"cache_dir": root / "cache"}
    path = root / "s.onnx"
    return export(_Structured().eval(), torch.randn(2, 4), path, progress=False, options=options)


@pytest.mark.parametrize("damage", ["flipped byte", "garbage", "threads"])
def test_serve_refuses_a_changed_or_garbage_file_before_starting_ray(
    structured, tmp_path, monkeypatch, capsys, damage
):
    path = tmp_path / "s.onnx"
    path.write_bytes(structured.read_bytes())
    side = json.loads(sidecar_path(structured).read_text())
    if damage == "flipped byte":
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01
        path.write_bytes(bytes(raw))
    elif damage == "garbage":
        path.write_bytes(b"not an onnx file at all")
        side = None
    else:
        side["runtime"]["num_threads"] = 100000
    if side is not None:
        sidecar_path(path).write_text(json.dumps(side))

    def never(*args, **kwargs):
        raise AssertionError("deploy() ran: Ray would have started")

    monkeypatch.setattr(embedl_dynamo.serve, "deploy", never)
    assert main(["serve", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("embedl-dynamo serve: error: s.")
    reasons = {
        "flipped byte": "does not match the sha256",
        "garbage": "is not an ONNX model",
        "threads": "num_threads=100000",
    }
    assert reasons[damage] in err


def test_serve_refuses_more_threads_than_load_takes_before_starting_ray(structured, capsys):
    assert main(["serve", str(structured), "--threads", "100000"]) == 2
    assert "invalid threads=100000; expected None or an integer" in capsys.readouterr().err


def test_serve_names_why_its_replicas_did_not_start(structured, monkeypatch, capsys):
    from embedl_dynamo.serve import ray_serve

    def run(app, name, **kwargs):  # Serve's answer when a replica fails check_answers
        raise RuntimeError("Deploying application 's' failed: a request of zeros fails")

    calls = []
    ray = SimpleNamespace(
        is_initialized=lambda: calls[-1:] == ["init"],
        init=lambda **kwargs: calls.append("init"),
        shutdown=lambda: calls.append("shutdown"),
        util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
    )
    serve = SimpleNamespace(start=lambda **kwargs: None, run=run, shutdown=lambda: None)
    monkeypatch.setattr(ray_serve, "_ray", lambda: (ray, serve))
    monkeypatch.setattr(ray_serve, "build_app", lambda path, name, **options: "app")
    monkeypatch.setattr(ray_serve, "_Started", type("_Started", (), {"ray": False, "apps": set()}))
    assert main(["serve", str(structured)]) == 1
    err = capsys.readouterr().err
    assert "the replicas did not start: Deploying application 's' failed: a request" in err
    assert calls == ["init", "shutdown"]  # the instance it started is not left running


def _post(url: str, text: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=text.encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for_line(lines: queue.Queue, word: str, deadline: float) -> str:
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None or word in line:
            return line or ""
    return ""


@pytest.mark.slow
def test_serve_runs_its_own_loopback_ray_and_stops_everything_it_started(structured):
    pytest.importorskip("ray.serve")
    port = free_port()
    env = {
        **os.environ,
        "RAY_ADDRESS": "127.0.0.1:1",  # a cluster the environment names: not to be joined
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # serve asks for loopback itself
    argv = ["serve", str(structured), "--port", str(port), "--cpus-per-replica", "1"]
    child = subprocess.Popen(
        [sys.executable, "-m", "embedl_dynamo.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    errors: list[str] = []  # read as it comes: a full pipe would stop the command

    def read() -> None:
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True).start()
    started: set[int] = set()
    deadline = time.monotonic() + TIME_LIMIT_S
    try:
        assert "serving" in _wait_for_line(lines, "serving", deadline), "".join(errors)[-3000:]
        started = descendants(child.pid)
        base = f"http://127.0.0.1:{port}/v2"
        with urllib.request.urlopen(f"{base}/health/ready", timeout=30) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"{base}/models/s", timeout=30) as reply:
            metadata = json.loads(reply.read())
        names = ["logits", "past_key_values.0.0", "past_key_values.0.1"]
        assert [o["name"] for o in metadata["outputs"]] == names
        assert metadata["omitted_outputs"] == [{"name": "aux", "value": None}]
        x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        x[1, 0] = np.nan  # served on ONNX Runtime: NaN answered as PyTorch computes it
        response, retries = post_infer(f"{base}/models/s/infer", infer_request([x], ["input_0"]))
        with torch.no_grad():
            want = load(structured)(torch.from_numpy(x))
        got = decode_outputs(response)
        np.testing.assert_array_equal(got["logits"], want["logits"].numpy())
        np.testing.assert_array_equal(got["past_key_values.0.1"], want["past_key_values"][0][1])
        bad = '{"inputs": [{"name": "input_0", "shape": [1, 4], "datatype": "FP32", "data": %s}]}'
        assert _post(f"{base}/models/s/infer", bad % "[1, null, 2, 3]") == (
            400,
            {"error": "input 'input_0': element 1 is null; send FP32 values"},
        )
        status, body = _post(f"{base}/models/s/infer", bad % "[1e39, 1, 2, 3]")
        assert status == 400 and "outside FP32's range" in body["error"]
        with pytest.raises(KServeError, match="HTTP 400"):  # sent once: a 4xx is not retried
            post_infer(f"{base}/models/s/infer", json.loads(bad % "[1, null, 2, 3]"))
        sockets = listening(descendants(child.pid))
        assert ("127.0.0.1", port) in sockets
        outside = [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
        assert not outside, outside
        # a process manager's stop, to the command alone (Ctrl-C takes the same path)
        child.send_signal(signal.SIGTERM)
        assert "stopped" in _wait_for_line(lines, "stopped", time.monotonic() + 60)
        assert child.wait(timeout=60) == 0
        gone = time.monotonic() + 30  # Ray's processes end with the instance
        while time.monotonic() < gone and alive(started - {child.pid}):
            time.sleep(0.5)
        assert not alive(started - {child.pid})
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        for pid in alive(started):
            os.kill(pid, signal.SIGKILL)
        child.wait(timeout=30)
