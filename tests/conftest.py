"""Fixtures for every test: the artifact cache lives in a private directory, never the user's.

Tests share one cache directory per session (so repeated compiles of the same graph stay warm);
``compile_isolation`` narrows it to one directory per test where builds are counted: every test
of the folders in ``ISOLATED_FOLDERS`` gets it, a file elsewhere asks for it with
``pytestmark = pytest.mark.usefixtures("compile_isolation")``.

``runtime="auto"`` times the ways to run a graph on every installed CPU runtime and keeps the
fastest (:mod:`embedl_dynamo.tuning.runtime_choice`). Timings are no test's business: here a
``mixed`` graph always "wins", then ONNX Runtime (and no family rule settles it), and PyTorch
itself (``beat_eager``) always loses, so which runtime a test compiles to does not
depend on machine load. ``tests/tuning/test_runtime_choice.py`` tests the real timing.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import embedl_dynamo
from embedl_dynamo import clear_reports
from tests.helpers import BUILD_COUNTS, count_builds

# the folders (mirroring the package) whose tests all compile, each test in isolation
ISOLATED_FOLDERS = frozenset({"cache", "dynamo", "graph", "onnx", "runtimes", "tuning"})
TESTS = Path(__file__).resolve().parent


def _usable_torchvision() -> None:
    """With the bench extra installed, the only reachable torchvision wheel is a CUDA build whose
    import fails with the CPU torch (``operator torchvision::nms does not exist``), and
    transformers fails through it: define its two op schemas first, as the benchmarks do
    (:func:`bench.models.zoo.import_model_libraries`). Checked in a child process, so a working
    torchvision is left alone."""
    if importlib.util.find_spec("torchvision") is None:
        return
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    if b"torchvision::nms does not exist" in probe.stderr:
        from bench.models.zoo import import_model_libraries

        import_model_libraries()


_usable_torchvision()


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist (``addopts`` starts one worker per core) each worker's PyTorch gets
    its share of the cores: every worker keeping PyTorch's default of all of them makes its
    OpenMP threads contend, and the suite runs slower in parallel than alone. Children a test
    starts inherit the share through ``OMP_NUM_THREADS``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


_share_the_cores_among_workers()


@pytest.fixture(scope="session", autouse=True)
def _private_cache_root(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path_factory.mktemp("embedl_dynamo_cache")))
    for name in ("EMBEDL_DYNAMO_RUNTIME", "EMBEDL_DYNAMO_BACKEND", "EMBEDL_DYNAMO_PRECISION"):
        patch.delenv(name, raising=False)
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def _builds_counted():
    """Every test sees the library's builders wrapped: ``helpers.BUILD_COUNTS`` counts builds."""
    patch = pytest.MonkeyPatch()
    count_builds(patch.setattr)
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _cache_writes_end_with_their_test():
    """A compile writes its artifact on a helper thread; no test's write spills into the next."""
    yield
    embedl_dynamo.wait_for_cache_writes(timeout=60)


@pytest.fixture(autouse=True)
def _deterministic_runtime_choice(monkeypatch):
    from embedl_dynamo.tuning import runtime_choice

    def timings(runtimes, inputs):
        def rank(label):
            if label == "eager":  # tests/tuning/test_beat_eager.py times it
                return 4.0
            return 0.5 if "mixed" in label else 1.0 if label.startswith("onnxruntime") else 2.0

        return {label: rank(label) for label in runtimes}

    monkeypatch.setattr(runtime_choice, "measure_runtimes", timings)
    # no family rule either (tests/tuning/test_runtime_rules.py puts them back)
    monkeypatch.setattr("embedl_dynamo.tuning.runtime_rules.FAMILY_RULES", ())
    yield


@pytest.fixture
def compile_isolation(tmp_path, monkeypatch):
    """A test of its own: private cache directory, no reports, no builds counted, fresh Dynamo."""
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("EMBEDL_DYNAMO_RUNTIME", "EMBEDL_DYNAMO_BACKEND", "EMBEDL_DYNAMO_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    clear_reports()
    BUILD_COUNTS.clear()
    embedl_dynamo.set_backend(None)  # the selection; the discovered entry points stay (a scan
    yield  # of every installed distribution per test; tests/backends rediscover on purpose
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _isolated_in_compiling_folders(request: pytest.FixtureRequest):
    """``compile_isolation`` for every test under one of ``ISOLATED_FOLDERS``."""
    folder = Path(request.path).resolve().relative_to(TESTS).parts[0]
    if folder in ISOLATED_FOLDERS:
        request.getfixturevalue("compile_isolation")
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (the exhaustive conformance dtypes) run only when asked for,
    ``-m slow``: the default run, CI's, stays within its time."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:  # deselected, not skipped: thousands of skip reports cost the parallel run time
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]
