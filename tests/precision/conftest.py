"""Fixtures for the precision tests: each compiles in isolation (see ``compile_isolation``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(compile_isolation):
    yield
