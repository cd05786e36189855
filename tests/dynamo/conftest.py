"""Fixtures for the tests of ``embedl_dynamo.dynamo``: each test compiles in isolation."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(compile_isolation):
    """A private cache directory, no reports, no builds counted, fresh Dynamo (tests/conftest.py)."""
    yield
