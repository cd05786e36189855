"""Fixtures for every test: the artifact cache lives in a private directory, never the user's.

Tests share one cache directory per session (so repeated compiles of the same graph stay warm);
``tests/compile/conftest.py`` narrows it to one directory per test where builds are counted.
"""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.report import clear_reports
from embedl_dynamo.runtimes.artifacts import BUILD_COUNTS


@pytest.fixture(scope="session", autouse=True)
def _private_cache_root(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path_factory.mktemp("embedl_dynamo_cache")))
    for name in ("EMBEDL_DYNAMO_RUNTIME", "EMBEDL_DYNAMO_BACKEND", "EMBEDL_DYNAMO_PRECISION"):
        patch.delenv(name, raising=False)
    yield
    patch.undo()


@pytest.fixture
def compile_isolation(tmp_path, monkeypatch):
    """A test of its own: private cache directory, no reports, no builds counted, fresh Dynamo."""
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("EMBEDL_DYNAMO_RUNTIME", "EMBEDL_DYNAMO_BACKEND", "EMBEDL_DYNAMO_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    clear_reports()
    BUILD_COUNTS.clear()
    embedl_dynamo.reset_backends()
    yield
    torch._dynamo.reset()
