"""Which Ray instance :func:`~embedl_dynamo.serve.deploy` uses and what
:func:`~embedl_dynamo.serve.undeploy` stops, on a stand-in for Ray (no cluster starts): a fresh
local instance of its own (``address="local"``: never one already running, nor ``RAY_ADDRESS``),
on loopback, shut down with its last application; in a cluster it joined, only its application.
``tests/serve/test_serve_command.py`` starts the real one."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from embedl_dynamo.serve import ray_serve

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class _FakeRay:
    def __init__(self, initialized: bool = False) -> None:
        self.up, self.calls = initialized, []
        self.util = SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **kwargs) -> None:
        self.calls.append(("init", kwargs))
        self.up = True

    def shutdown(self) -> None:
        self.calls.append(("shutdown", {}))
        self.up = False


class _FakeServe:
    def __init__(self, fail: bool = False) -> None:
        self.calls, self.apps, self.fail = [], set(), fail

    def start(self, **kwargs) -> None:
        self.calls.append(("start", kwargs))

    def run(self, app, name, **kwargs) -> str:
        if self.fail:
            raise RuntimeError("Deploying application m failed: a request of zeros fails")
        self.apps.add(name)
        return f"handle:{name}"

    def status(self):
        return SimpleNamespace(applications={name: None for name in self.apps})

    def delete(self, name) -> None:
        self.calls.append(("delete", name))
        self.apps.discard(name)

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Ray and Serve stand-ins, no application built, this module's record of what it started
    fresh, and Ray not yet imported as far as deploy() can tell."""
    ray, serve = _FakeRay(), _FakeServe()
    monkeypatch.setattr(ray_serve, "_ray", lambda: (ray, serve))
    monkeypatch.setattr(ray_serve, "build_app", lambda path, name, **options: f"app:{name}")
    monkeypatch.setattr(ray_serve, "_Started", type("_Started", (), {"ray": False, "apps": set()}))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setenv(LOOPBACK_ENV, "")  # recorded as unset, so what deploy() sets is undone
    monkeypatch.delenv(LOOPBACK_ENV)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")  # a cluster already running elsewhere
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    return ray, serve, path


def test_deploy_starts_its_own_local_instance_on_loopback_and_stops_it(fake):
    ray, serve, path = fake
    assert ray_serve.deploy(path) == "handle:m"
    init = [kwargs for call, kwargs in ray.calls if call == "init"]
    assert init[0]["address"] == "local"  # not None/"auto": those follow RAY_ADDRESS
    assert ray_serve.os.environ[LOOPBACK_ENV] == "0"  # Ray's own ports on loopback
    start = next(kwargs for call, kwargs in serve.calls if call == "start")
    assert start["http_options"] == {"host": "127.0.0.1", "port": 8000}
    ray_serve.undeploy("m")
    assert ("shutdown", None) in serve.calls and ray.calls[-1] == ("shutdown", {})


def test_the_instance_deploy_starts_gets_serves_request_path_settings(fake, monkeypatch):
    ray, _, path = fake
    monkeypatch.setenv("RAY_SERVE_USE_GRPC_BY_DEFAULT", "0")  # the caller's choice wins
    ray_serve.deploy(path)
    env = ray.calls[0][1]["runtime_env"]["env_vars"]
    assert env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert "RAY_SERVE_USE_GRPC_BY_DEFAULT" not in env
    assert set(env) < set(ray_serve.SERVE_LATENCY_SETTINGS)


def test_a_cluster_deploy_joins_keeps_its_own_settings(fake):
    ray, _, path = fake
    ray_serve.deploy(path, address="10.0.0.9:6379")
    assert "runtime_env" not in ray.calls[0][1]


def test_host_beyond_loopback_leaves_ray_its_own_addresses(fake):
    ray, _, path = fake
    ray_serve.deploy(path, host="0.0.0.0")
    assert LOOPBACK_ENV not in ray_serve.os.environ
    assert ray.calls[0][1]["address"] == "local"


@pytest.mark.parametrize("joined", ["address", "initialized"])
def test_in_a_cluster_it_joined_it_stops_only_its_application(fake, joined):
    ray, serve, path = fake
    serve.apps.add("theirs")
    if joined == "initialized":
        ray.up = True  # the caller's own ray.init()
        ray_serve.deploy(path)
        assert not [call for call, _ in ray.calls if call == "init"]
    else:
        ray_serve.deploy(path, address="10.0.0.9:6379")
        assert ray.calls[0][1]["address"] == "10.0.0.9:6379"
    ray_serve.undeploy("m")
    assert serve.calls[-1] == ("delete", "m") and serve.apps == {"theirs"}
    assert ("shutdown", None) not in serve.calls and ("shutdown", {}) not in ray.calls


def test_a_failed_deployment_shuts_down_the_instance_it_started(fake):
    ray, serve, path = fake
    serve.fail = True
    with pytest.raises(RuntimeError, match="a request of zeros fails"):
        ray_serve.deploy(path)
    assert ray.calls[-1] == ("shutdown", {}) and not ray.up


def test_grpc_is_offered_on_the_instance_deploy_starts_and_bound_to_loopback(fake):
    from embedl_dynamo.serve import GRPC_SERVICER

    ray, serve, path = fake
    ray_serve.deploy(path, grpc_port=9100)
    start = next(kwargs for call, kwargs in serve.calls if call == "start")
    assert start["grpc_options"] == {"port": 9100, "grpc_servicer_functions": [GRPC_SERVICER]}
    hook = ray.calls[0][1]["runtime_env"]["worker_process_setup_hook"]
    assert callable(hook) and "<locals>" in hook.__qualname__  # shipped by value, not by import
    ray_serve.deploy(path, name="second", grpc_port=9100, route_prefix="/second")  # same instance
    with pytest.raises(ValueError, match="grpc_port=9200: Ray Serve fixes its gRPC servicers"):
        ray_serve.deploy(path, name="third", grpc_port=9200)


def test_grpc_on_a_cluster_deploy_joined_is_refused_before_anything_starts(fake):
    ray, serve, path = fake
    with pytest.raises(ValueError, match="only on the Ray instance it starts itself"):
        ray_serve.deploy(path, address="10.0.0.9:6379", grpc_port=9100)
    assert not ray.calls and not serve.calls


def test_the_grpc_hook_lets_ray_pickle_requests_and_binds_the_proxy_to_loopback(monkeypatch):
    import pickle

    from ray.serve._private import default_impl
    from tritonclient.grpc import service_pb2

    from embedl_dynamo.serve.grpc_ingress import grpc_setup_hook

    monkeypatch.delitem(sys.modules, "grpc_service_pb2", raising=False)
    bound = []
    monkeypatch.setattr(default_impl, "add_grpc_address", lambda server, at: bound.append(at))
    request = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\0"])
    with pytest.raises(pickle.PicklingError, match="grpc_service_pb2"):
        pickle.dumps(request)  # what Ray's proxy hits without the hook
    grpc_setup_hook()()
    assert pickle.loads(pickle.dumps(request)) == request
    default_impl.add_grpc_address("server", "[::]:9000")  # loopback not asked for
    grpc_setup_hook(loopback=True)()
    default_impl.add_grpc_address("server", "[::]:9001")
    grpc_setup_hook(loopback=True)()  # once only: a second run does not wrap it again
    default_impl.add_grpc_address("server", "0.0.0.0:9002")
    assert bound == ["[::]:9000", "127.0.0.1:9001", "0.0.0.0:9002"]
