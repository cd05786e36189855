"""Fixtures for every test: the artifact cache lives in a private directory, never the user's.

Tests share one cache directory per session (so repeated compiles of the same graph stay warm);
``tests/compile/conftest.py`` narrows it to one directory per test where builds are counted.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_root(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path_factory.mktemp("embedl_dynamo_cache")))
    for name in ("EMBEDL_DYNAMO_RUNTIME", "EMBEDL_DYNAMO_BACKEND"):
        patch.delenv(name, raising=False)
    yield
    patch.undo()
