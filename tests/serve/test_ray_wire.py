"""Ray Serve answers Triton's own clients (slow: a local Ray instance starts): binary HTTP with
``tritonclient.http`` and gRPC with ``tritonclient.grpc`` give ``load()``'s outputs for float
and int64 inputs and a dict output, a second application is reached over gRPC by its
``application`` metadata, JSON still works, bodies that do not add up and a datatype not served
get a 400 naming the problem, a request that does not fit a gRPC ``INVALID_ARGUMENT``, the
replica's inference statistics count them over both protocols, and every
socket the instance listens on, its gRPC proxy's included, is on loopback.

The scenario runs in its own process (:mod:`tests.serve.wire_scenario`), under a time limit, in
its own process group: whatever happens, nothing of it outlives the test.
"""

from __future__ import annotations

import ipaddress

import pytest

from tests.serve.processes import run_scenario

pytest.importorskip("ray.serve")
pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

TIME_LIMIT_S = 240
# a cluster the environment names is not to be joined; deploy() asks for loopback itself
ENV = {"RAY_ADDRESS": "127.0.0.1:1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None}


@pytest.mark.slow
def test_tritonclient_over_binary_http_and_grpc_answers_like_load(tmp_path):
    seen = run_scenario("tests.serve.wire_scenario", [str(tmp_path)], TIME_LIMIT_S, ENV)
    http = seen["http"]
    assert http["live"] and http["ready"]
    assert http["metadata_outputs"] == ["logits", "extra.0", "extra.1"]
    assert http["binary_equal"] and http["default_equal"]
    assert http["binary_dtypes"] == ["float32", "float32", "int64"]
    assert seen["json_equal"]
    grpc = seen["grpc"]
    assert grpc["mixed_equal"] and grpc["second_equal"] and grpc["live"]
    assert (grpc["mixed_metadata"], grpc["second_metadata"]) == ("mixed", "second")
    assert grpc["mixed_ready"] and grpc["second_ready"]
    status, message = grpc["bad"]
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert "input 'input_0' has shape [-1, 4] (-1: any size), got [3, 3]" in message
    bad = seen["bad"]
    assert bad["short"][0] == 400 and "runs past the 12 bytes" in bad["short"][1]
    assert bad["extra"][0] == 400 and "add up to 16" in bad["extra"][1]
    assert bad["bf16"][0] == 400 and "datatype 'BF16' is not supported" in bad["bf16"][1]
    # tritonclient reads the statistics extension over both: 2 binary HTTP, 1 gRPC and 1 JSON
    # requests of 3 rows answered; the gRPC shape and the 3 bodies above failed
    statistics = seen["statistics"]
    assert statistics["http"] == statistics["grpc"] == [4, 4, 12]
    assert statistics["http_all"] == ["mixed"]
    assert all(ns > 0 for ns in statistics["stages_ns"])
    sockets = [tuple(s) for s in seen["sockets"]]
    http_port, grpc_port = seen["ports"]
    assert ("127.0.0.1", http_port) in sockets and ("127.0.0.1", grpc_port) in sockets
    outside = [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
    assert not outside, outside
