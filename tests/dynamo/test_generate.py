"""Decoder LLMs generate through the backend (issue 24): greedy tokens equal eager's.

Tiny random-init configs of transformers' own model classes (no download). With the dynamic cache
and with Hugging Face's static cache, the prefill and the decode steps compile (grouped-query
attention included) into a bounded number of graphs; the static cache's in-place writes run in
the runtime and are written back into the cache's tensors.
"""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from tests.helpers import greedy_generate, left_padded_batch, tiny_decoder

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_tokens_equal_eager_in_a_bounded_number_of_compiled_graphs(name, cache):
    """Batch 1, then a left-padded batch of 2, through one compiled forward. The static cache's
    in-place writes (``index_copy_`` into the cache, its position counter's ``add_``) run in
    the runtime and are written back; they were lost once, giving other tokens from the first."""
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    batch, mask = left_padded_batch()
    reference = tiny_decoder(name)
    eager = greedy_generate(reference, ids, NEW_TOKENS, **kw)
    eager_batch = greedy_generate(reference, batch, NEW_TOKENS, attention_mask=mask, **kw)
    model = tiny_decoder(name)
    model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS, **kw), eager)
    assert torch.equal(
        greedy_generate(model, batch, NEW_TOKENS, attention_mask=mask, **kw), eager_batch
    )
    subgraphs = embedl_dynamo.last_report().subgraphs
    # prefill and decode, each static then with Dynamo's dynamic sizes (batch, length)
    assert 1 <= len(subgraphs) <= 6, [str(s) for s in subgraphs]
    assert {s.runtime for s in subgraphs} == {"onnxruntime"}, [s.reason for s in subgraphs]
    # other lengths: the static cache's length becomes dynamic once, then no graph is built
    greedy_generate(model, ids, NEW_TOKENS + 5, **kw)
    built = len(embedl_dynamo.last_report().subgraphs)
    greedy_generate(model, ids, NEW_TOKENS + 9, **kw)
    assert len(embedl_dynamo.last_report().subgraphs) == built <= 8
