"""A written-back input updated in the runtime's own run (``Runtime.infer(in_place=...)``):
ONNX Runtime (IO binding) and OpenVINO (shared-memory tensors) take a KV cache as both the
scatter's input and its output, so a decode step neither copies the cache into a new output
nor back into the caller's tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo.graph.capture import capture
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings

LENGTH = 16
RUNTIMES = [
    OnnxRuntime,
    pytest.param(
        OpenVINORuntime,
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]


class _Decode(nn.Module):
    """One decode step on a cache of shape (batch, heads, length, dim): the new row scattered
    in at ``position`` (the functional form of a static cache's ``index_copy_``), then
    attention over the updated cache. Returns the attention and the new cache."""

    def forward(self, cache, position, row, query):
        new = cache.index_copy(2, position, row)
        weights = torch.softmax(query @ new.transpose(-1, -2), dim=-1)
        return weights @ new, new


def _step(step: int):
    generator = torch.Generator().manual_seed(step)
    row = torch.randn(1, 2, 1, 8, generator=generator)
    query = torch.randn(1, 2, 1, 8, generator=generator)
    return torch.tensor([step]), row, query


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request, tmp_path_factory):
    cache = torch.randn(1, 2, LENGTH, 8, generator=torch.Generator().manual_seed(0))
    sample = [cache, *_step(0)]
    gm = capture(_Decode(), sample)
    settings = Settings.from_options({"cache_dir": str(tmp_path_factory.mktemp("c"))}, env={})
    return request.param(settings).build(gm, sample)


def test_the_cache_is_updated_in_its_own_memory_and_returned_as_itself(runtime):
    cache = torch.randn(1, 2, LENGTH, 8, generator=torch.Generator().manual_seed(1))
    eager, pointer = cache.clone(), cache.data_ptr()
    for step in range(3):
        position, row, query = _step(step)
        version = cache._version
        out, new = runtime.infer(cache, position, row, query, in_place={0: -1})
        expected_out, eager = _Decode()(eager, position, row, query)
        assert new is cache and cache.data_ptr() == pointer
        assert cache._version > version  # an in-place change, as copy_ would record
        torch.testing.assert_close(cache, eager, rtol=0, atol=0)  # a scatter is exact
        torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)


def test_without_in_place_or_with_a_strided_cache_the_output_is_a_new_tensor(runtime):
    """Nothing asked, or a cache that is not contiguous (binding its memory would give ONNX
    Runtime another layout): a new tensor, the caller's untouched, for the caller to copy."""
    position, row, query = _step(1)
    cache = torch.zeros(1, 2, LENGTH, 8)
    _, new = runtime.infer(cache, position, row, query)
    assert new.data_ptr() != cache.data_ptr() and not cache.any()
    strided = torch.zeros(1, 2, 8, LENGTH).transpose(2, 3)
    _, new = runtime.infer(strided, position, row, query, in_place={0: -1})
    assert new.data_ptr() != strided.data_ptr() and not strided.any()
    torch.testing.assert_close(new[:, :, 1:2], row)
    written = torch.zeros(1, 2, LENGTH, 8)  # written in place, then no longer bound: a later
    runtime.infer(written, position, row, query, in_place={0: -1})  # call writes elsewhere
    before, cache = written.clone(), torch.zeros(1, 2, LENGTH, 8)
    _, new = runtime.infer(cache, *_step(2))
    assert written.equal(before) and new.data_ptr() != cache.data_ptr() and not cache.any()


@pytest.mark.parametrize("runtime_cls", RUNTIMES)
def test_a_served_runtime_writes_in_place_after_its_checked_first_call(tmp_path, runtime_cls):
    """The first call on the checked sample returns the check's outputs (new tensors, which
    the caller copies); the calls after it write in place."""
    cache = torch.zeros(1, 2, LENGTH, 8)
    sample = [cache, *_step(0)]
    settings = Settings.from_options({"cache_dir": str(tmp_path)}, env={})
    runtime = runtime_cls(settings).build(capture(_Decode(), sample), sample)
    served = runtime.serve().writing_in_place({0: -1})
    _, first = served(*sample)
    assert first is not cache and not cache.any()  # the check ran on the sample, functionally
    cache.copy_(first)
    _, second = served(cache, *_step(1))
    assert second is cache
    assert cache[:, :, 0].equal(first[:, :, 0]) and cache[:, :, 1].equal(_step(1)[1][:, :, 0])
