"""A cache lock held by another process: a bounded wait, one message, then a build without
the cache (issue 39 item 6: the compile blocked forever, silently)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from embedl_dynamo.cache.files import (
    DEFAULT_LOCK_TIMEOUT_S,
    ENV_CACHE_LOCK_TIMEOUT,
    claim_cache_root,
    lock_timeout,
)
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.errors import ConfigurationError
from embedl_dynamo.settings import Settings

_HOLD = """
import fcntl, sys, time
f = open(sys.argv[1], "a+b")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def held_lock(tmp_path):
    """The lock of one cache key, held by a child process until the test ends."""
    cache = ArtifactCache(tmp_path / "cache", "onnx")
    key = content_key("held by another process")
    lock = cache.path(key, ".lock")
    claim_cache_root(cache.root)  # as the other process did before its first write
    lock.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "held"
        yield cache, key
    finally:
        child.kill()
        child.wait()


def test_a_lock_held_elsewhere_is_waited_for_then_built_without_the_cache(
    held_lock, monkeypatch, caplog
):
    cache, key = held_lock
    monkeypatch.setenv(ENV_CACHE_LOCK_TIMEOUT, "0.6")
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache"):
        path, built = cache.get_or_build(key, lambda p: p.write_bytes(b"artifact"), ".onnx")
    assert time.monotonic() - start < 10
    assert built and path.read_bytes() == b"artifact"
    assert cache.root not in path.parents  # not stored: the other process holds the entry
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "waiting for another process's lock" in messages[0]
    assert ENV_CACHE_LOCK_TIMEOUT in messages[0]
    assert "building without the cache" in messages[1]


def test_the_lock_timeout_is_read_and_checked(monkeypatch, tmp_path):
    assert lock_timeout({}) == DEFAULT_LOCK_TIMEOUT_S
    assert lock_timeout({ENV_CACHE_LOCK_TIMEOUT: "12.5"}) == 12.5
    assert lock_timeout({ENV_CACHE_LOCK_TIMEOUT: "none"}) is None
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv(ENV_CACHE_LOCK_TIMEOUT, bad)
        with pytest.raises(ConfigurationError, match=rf"invalid {ENV_CACHE_LOCK_TIMEOUT}="):
            Settings.from_options({"cache_dir": tmp_path})
