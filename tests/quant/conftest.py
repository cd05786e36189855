"""Shared fixtures of the INT8 tests: a digits CNN trained once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits():
    from tests.digits import train_digits_cnn

    model, data = train_digits_cnn(epochs=6)
    return model, data
