"""Fixtures for the torch.compile tests: a private cache directory and a clean Dynamo state."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(compile_isolation):
    yield
