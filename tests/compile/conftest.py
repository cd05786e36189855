"""Fixtures for the torch.compile tests: a private cache directory and a clean Dynamo state."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.report import clear_reports
from embedl_dynamo.runtimes.artifacts import BUILD_COUNTS


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EMBEDL_DYNAMO_RUNTIME", raising=False)
    monkeypatch.delenv("EMBEDL_DYNAMO_BACKEND", raising=False)
    torch._dynamo.reset()
    clear_reports()
    BUILD_COUNTS.clear()
    embedl_dynamo.reset_backends()
    yield
    torch._dynamo.reset()
