"""State the compiled graph does not own: weights changed after compiling, buffers and inputs
mutated in forward. PyTorch's semantics are kept: rebuild, write the new values back, or run in
PyTorch."""

from __future__ import annotations

import gc
import threading
import time
import warnings

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.cache import files
from embedl_dynamo.dynamo.compiled_call import WEIGHT_SETS
from embedl_dynamo.runtimes.served import Served
from tests.helpers import BUILD_COUNTS, assert_close_to_scale, wait_until_stored
from tests.models import TinyConvNet

X = torch.randn(2, 3, 8, 8)


def test_weights_changed_in_place_after_compiling_are_picked_up():
    model = TinyConvNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        model.fc.weight.mul_(2)
        assert_close_to_scale(compiled(X), model(X))
        assert_close_to_scale(compiled(X), model(X))  # the refitted artifact, nothing more
    assert BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == 1  # no second export


def test_weights_changed_in_place_while_the_artifact_is_written_are_refitted(monkeypatch):
    """The build's file is written from the weights' memory on a helper thread: changed in
    place meanwhile, it is not stored (it would hold neither set), and the refit takes the
    export kept in memory instead (before: the new weights were built anew)."""
    run_in_background = files.run_in_background
    started = threading.Event()

    def slow(write, name):
        return run_in_background(lambda: (started.wait(30), write())[1], name)

    monkeypatch.setattr(files, "run_in_background", slow)
    model = TinyConvNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        compiled(X)
        model.fc.weight.mul_(2)  # before the write has begun
        started.set()
        files.wait_for_cache_writes(timeout=60)
        assert_close_to_scale(compiled(X), model(X))
        assert_close_to_scale(compiled(X), model(X))
    assert BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == 1  # no second export


def test_load_state_dict_after_compiling_is_picked_up():
    model, other = TinyConvNet().eval(), TinyConvNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        compiled(X)
        model.load_state_dict(other.state_dict())
        assert_close_to_scale(compiled(X), other(X))


@pytest.mark.parametrize("write_delay_s", [0.0, 0.5])
def test_two_instances_called_in_turn_each_keep_their_build(write_delay_s, monkeypatch):
    """Dynamo gives the second instance the first one's graph (its guards check the weights'
    sizes, not which tensors they are): each instance gets a build of its own weights, kept,
    not rebuilt on every switch (before: a rebuild, and a runtime more in memory, per switch).
    The second is a refit of the first's artifact even while that is still being written on a
    helper thread (a loaded machine: before, it was built anew, as if the entry were gone)."""
    run_in_background = files.run_in_background

    def slow(write, name):
        return run_in_background(lambda: (time.sleep(write_delay_s), write())[1], name)

    monkeypatch.setattr(files, "run_in_background", slow)
    first, second = TinyConvNet().eval(), TinyConvNet().eval()
    compiled = [torch.compile(m, backend="embedl_onnxruntime") for m in (first, second)]
    with torch.no_grad():
        for _ in range(3):
            for model, fn in zip((first, second), compiled):
                assert_close_to_scale(fn(X), model(X))
    assert BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == 1  # the second: a refit


def _live_runtimes() -> int:
    gc.collect()
    return sum(type(o) is Served for o in gc.get_objects())  # not isinstance: no proxies


def test_a_build_for_weights_modified_in_place_is_released_not_kept():
    """Versions only grow: a build for weights modified in place since never runs again, so
    it is released (before: each change chained a build to the last one, all kept)."""
    model = TinyConvNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    changes = WEIGHT_SETS + 2
    with torch.no_grad():
        compiled(X)
        live = _live_runtimes()
        for _ in range(changes):
            wait_until_stored()
            model.fc.weight.mul_(1.5)
            assert_close_to_scale(compiled(X), model(X))
    assert BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == changes  # each a refit
    assert _live_runtimes() == live  # one build alive, the latest


class _Counter(nn.Module):
    """Counts its calls in a buffer and scales the output by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.fc(x) * self.steps


def test_a_buffer_updated_in_forward_keeps_counting_in_the_runtime():
    model, reference = _Counter().eval(), _Counter().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            assert_close_to_scale(compiled(x), reference(x))
    assert float(model.steps) == 3.0
    assert not [str(w.message) for w in caught if "PyTorch" in str(w.message)]
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == ["onnxruntime"]


class _InPlaceInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return self.fc(x).relu() * 2


def test_an_input_modified_in_place_is_modified_for_the_caller():
    model = _InPlaceInput().eval()
    x, x_eager = torch.zeros(2, 4), torch.zeros(2, 4)
    with torch.no_grad():
        compiled = torch.compile(model, backend="embedl_onnxruntime")
        for _ in range(2):
            assert_close_to_scale(compiled(x), model(x_eager))
    assert torch.equal(x, x_eager)
    assert embedl_dynamo.last_report().subgraphs[0].runtime == "onnxruntime"


class _KeyValueCache(nn.Module):
    """Writes each step's row into a cache input with ``index_copy_``, as a static KV cache does,
    and returns the cache itself beside a reduction of it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, cache, position):
        cache.index_copy_(0, position, self.fc(x))
        return cache.relu().sum(0) * 2, cache


def test_a_cache_written_in_place_is_written_back_and_returned_as_itself():
    model = _KeyValueCache().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    cache, cache_eager = torch.zeros(6, 4), torch.zeros(6, 4)
    with torch.no_grad():
        for step in range(3):
            x, position = torch.randn(1, 4), torch.tensor([step])
            total, returned = compiled(x, cache, position)
            total_eager, _ = model(x, cache_eager, position)
            assert returned is cache  # eager returns the caller's tensor, not a copy
            assert_close_to_scale(total, total_eager)
            assert_close_to_scale(cache, cache_eager)
    assert {s.runtime for s in embedl_dynamo.last_report().subgraphs} == {"onnxruntime"}


def test_lazy_int8_calibrates_once_across_threads(tmp_path):
    import threading

    from embedl_dynamo.backends.onnxruntime import BACKEND
    from embedl_dynamo.quant.int8.lazy import calibrate_then_build
    from embedl_dynamo.settings import Settings

    patterns = [*BACKEND.conversion_patterns, *BACKEND.fusion_patterns]
    fused = embedl_dynamo.transform(TinyConvNet().eval(), (X,), patterns).model
    built = []
    settings = Settings(calibration_steps=4, cache_dir=tmp_path)
    lazy = calibrate_then_build(
        fused, [X], BACKEND.quantizer, settings, lambda q: built.append(q) or q
    )
    threads = [threading.Thread(target=lambda: [lazy(X) for _ in range(5)]) for _ in range(4)]
    with torch.no_grad():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(built) == 1 and lazy.steps_seen == 4 and lazy.phase == "quantized"
    assert lazy.report["calibration_forward_passes"] == 4
