"""Decoder LLMs generate through the backend (issue 24): greedy tokens equal eager's.

Tiny random-init configs of transformers' own model classes (no download). With the dynamic cache
and with Hugging Face's static cache, the prefill and the decode steps compile (grouped-query
attention included) into a bounded number of graphs; the static cache's in-place writes run in
the runtime and are written back into the cache's tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import embedl_dynamo
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.dynamo.compile import compile_subgraph
from embedl_dynamo.dynamo.compiled_call import in_place_writes
from embedl_dynamo.graph.freeze import freeze
from embedl_dynamo.settings import Settings
from tests.helpers import (
    assert_close_to_scale,
    dynamo_graph,
    greedy_generate,
    left_padded_batch,
    tiny_decoder,
)

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8


# The static cache on ONNX Runtime: test_the_static_cache_stays_in_its_tensors_through_generate
# here, test_decoders' mistral (left-padded batch) and test_generate_bounds (other lengths)
# the dynamic cache on ONNX Runtime slow (about 15 s): by default test_decoders' phi3 generates
# with it (a left-padded batch too, in at most 6 graphs), and qwen2 under dynamic=True; the
# static cache on OpenVINO slow too (about 15 s, to keep the default run within five minutes):
# CI's slow slice runs both, and by default the static cache generates on ONNX Runtime
@pytest.mark.parametrize(
    ("name", "cache", "runtime"),
    [
        pytest.param("llama", "dynamic", "onnxruntime", marks=pytest.mark.slow),
        pytest.param("llama", "static", "openvino", marks=pytest.mark.slow),
    ],
)
def test_greedy_tokens_equal_eager_in_a_bounded_number_of_compiled_graphs(name, cache, runtime):
    """Batch 1, then a left-padded batch of 2, through one compiled forward. The static cache's
    in-place writes (``index_copy_`` into the cache, its position counter's ``add_``) run in
    the runtime and are written back; they were lost once, giving other tokens from the first.
    On OpenVINO every graph once ran in PyTorch: its 0-d position input reached the model
    compiled for static sizes as shape (1,)."""
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    batch, mask = left_padded_batch()
    reference = tiny_decoder(name)
    eager = greedy_generate(reference, ids, NEW_TOKENS, **kw)
    eager_batch = greedy_generate(reference, batch, NEW_TOKENS, attention_mask=mask, **kw)
    model = tiny_decoder(name)
    model.forward = torch.compile(model.forward, backend=f"embedl_{runtime}")
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS, **kw), eager)
    assert torch.equal(
        greedy_generate(model, batch, NEW_TOKENS, attention_mask=mask, **kw), eager_batch
    )
    subgraphs = embedl_dynamo.last_report().subgraphs
    # prefill and decode, each static then with Dynamo's dynamic sizes (batch, length)
    assert 1 <= len(subgraphs) <= 6, [str(s) for s in subgraphs]
    assert {s.runtime for s in subgraphs} == {runtime}, [s.reason for s in subgraphs]
    # other lengths: the static cache's length becomes dynamic once, then no graph is built
    greedy_generate(model, ids, NEW_TOKENS + 5, **kw)
    built = len(embedl_dynamo.last_report().subgraphs)
    greedy_generate(model, ids, NEW_TOKENS + 9, **kw)
    assert len(embedl_dynamo.last_report().subgraphs) == built <= 8


def test_generate_with_hugging_faces_compile_config():
    """``generate(compile_config=CompileConfig(backend=...))``, Hugging Face's own way: it sends
    its default ``mode="reduce-overhead"`` (an inductor setting), which our backends once
    refused as an unknown keyword; on a CPU it compiles only when told
    (``_compile_all_devices``)."""
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    reference, model = tiny_decoder("llama"), tiny_decoder("llama")
    eager = greedy_generate(reference, ids, NEW_TOKENS, cache_implementation="static")
    config = transformers.CompileConfig(backend="embedl_onnxruntime")
    assert config.mode == "reduce-overhead"
    config._compile_all_devices = True
    kw = {"cache_implementation": "static", "compile_config": config}
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS, **kw), eager)
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert subgraphs and {s.runtime for s in subgraphs} == {"onnxruntime"}, subgraphs


def test_an_inductor_mode_is_ignored_not_refused():
    model = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    compiled = torch.compile(model, backend="embedl_onnxruntime", mode="max-autotune")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_the_static_cache_stays_in_its_tensors_through_generate():
    """The cache's tensors keep their memory across the decode steps, and hold what eager's
    cache holds after the same generation."""
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    reference, model = tiny_decoder("llama"), tiny_decoder("llama")
    caches = [
        transformers.StaticCache(config=m.config, max_cache_len=24) for m in (reference, model)
    ]
    eager = greedy_generate(reference, ids, NEW_TOKENS, past_key_values=caches[0])
    model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")
    greedy_generate(model, ids, 1, past_key_values=caches[1])  # creates the cache tensors
    caches[1].reset()
    pointers = [layer.keys.data_ptr() for layer in caches[1].layers]
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS, past_key_values=caches[1]), eager)
    assert [layer.keys.data_ptr() for layer in caches[1].layers] == pointers
    for ours, theirs in zip(caches[1].layers, caches[0].layers):
        assert_close_to_scale(ours.keys, theirs.keys)
        assert_close_to_scale(ours.values, theirs.values)


class _CacheStep(nn.Module):
    """A decode step's state as Hugging Face's static cache keeps it: the new row written into
    the cache with ``index_copy_`` at the position a counter holds, the counter then bumped,
    attention over the cache."""

    def forward(self, row, query, cache, counter):
        cache.index_copy_(2, counter, row)
        counter.add_(1)
        weights = torch.softmax(query @ cache.transpose(-1, -2), dim=-1)
        return weights @ cache


class _ReadBeforeWrite(nn.Module):
    """Reads the cache's values before writing it: the old values must stay readable, so the
    runtime may not compute the write in the cache's memory."""

    def forward(self, row, cache, position):
        total = cache.sum()
        cache.index_copy_(2, position, row)
        return cache * total


def _step_inputs(length: int = 32):
    generator = torch.Generator().manual_seed(3)
    row, query = torch.randn(1, 2, 1, 8, generator=generator), torch.randn(1, 2, 1, 8)
    return row, query, torch.zeros(1, 2, length, 8), torch.tensor([0])


def _in_place(model, *inputs):
    """Which written inputs may be written in place, named by their shape (Dynamo orders the
    placeholders), with their output positions; and the shapes of all written inputs."""
    gm = dynamo_graph(model, *[t.clone() for t in inputs])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta["example_value"] for n in placeholders]
    frozen = freeze(gm, values, write_back=True)
    shape = lambda k: tuple(values[frozen.user_inputs[k]].shape)  # noqa: E731
    found = in_place_writes(gm, frozen.user_inputs, frozen.written)
    return {shape(k): out for k, out in found.items()}, [shape(k) for k in frozen.written]


def test_a_cache_scattered_into_is_written_in_place_a_counter_read_first_is_not():
    """Match: the cache, whose first write is a scatter. No match: the counter, read before
    its ``add_`` (the scatter's index), which must stay the old value while the graph runs."""
    found, written = _in_place(_CacheStep(), *_step_inputs())
    assert sorted(written) == [(1,), (1, 2, 32, 8)]
    assert found == {(1, 2, 32, 8): written.index((1, 2, 32, 8)) - 2}


def test_a_cache_read_before_its_write_is_not_written_in_place():
    row, _, cache, position = _step_inputs()
    found, written = _in_place(_ReadBeforeWrite(), row, cache, position)
    assert written == [(1, 2, 32, 8)] and found == {}


class _CopiesInto(TorchDispatchMode):
    """Counts ``copy_`` calls whose destination is ``target``'s memory."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.target, self.count = target.data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default and args[0].data_ptr() == self.target:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("backend", "length"), [(ONNXRUNTIME, 32), (ONNXRUNTIME, 128), (OPENVINO, 32)]
)
def test_a_decode_step_copies_no_cache(tmp_path, backend, length):
    """The compiled step (the runtime and its write-back, as Dynamo calls it) leaves the new
    cache in the caller's tensor without a ``copy_`` into it, whatever the cache's length;
    the counter (a few bytes) is copied back. Values as eager's."""
    captured = []

    def capturing(gm, inputs, **_):
        captured.append((gm, inputs))
        return gm.forward

    model, eager_inputs = _CacheStep(), _step_inputs(length)
    first = [t.clone() for t in eager_inputs]
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capturing)(*first)
        ((gm, sample),) = captured
        order = [next(i for i, t in enumerate(first) if t is a) for a in sample]
        step = compile_subgraph(gm, sample, backend, Settings(cache_dir=tmp_path))
        step(*sample)  # Dynamo's first call, on the sample: the check's outputs, copied back
        model(*eager_inputs)
        inputs = [t.clone() for t in eager_inputs]
        for k in range(2):
            with _CopiesInto(inputs[2]) as copies:
                (out,) = step(*[inputs[i] for i in order])
            expected = model(*eager_inputs)
            assert copies.count == 0, f"step {k}: the cache was copied"
            assert_close_to_scale(out, expected)
            assert torch.equal(inputs[2], eager_inputs[2])
            assert torch.equal(inputs[3], eager_inputs[3])
    assert embedl_dynamo.last_report().subgraphs[-1].runtime == backend.name
