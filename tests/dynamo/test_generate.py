"""Decoder LLMs generate through the backend (issue 24): greedy tokens equal eager's.

Tiny random-init configs of transformers' own model classes (no download). With the dynamic cache
and with Hugging Face's static cache, the prefill and the decode steps compile (grouped-query
attention included) into a bounded number of graphs; the static cache's in-place writes run in
the runtime and are written back into the cache's tensors.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import embedl_dynamo

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8


def _decoder(name: str, kv_heads: int = 2):
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=kv_heads, vocab_size=100)  # fmt: skip
    config, cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[name]
    torch.manual_seed(0)
    return cls(config(**kw)).eval()


def _generate(model, ids, new_tokens=NEW_TOKENS, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, **kw)


def _left_padded_batch():
    """Two prompts of 8 and 5 tokens, the shorter one left-padded, as tokenizers pad for
    generation."""
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_tokens_equal_eager_in_a_bounded_number_of_compiled_graphs(name, cache):
    """Batch 1, then a left-padded batch of 2, through one compiled forward. The static cache's
    in-place writes (``index_copy_`` into the cache, its position counter's ``add_``) run in
    the runtime and are written back; they were lost once, giving other tokens from the first."""
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    batch, mask = _left_padded_batch()
    reference = _decoder(name)
    eager = _generate(reference, ids, **kw)
    eager_batch = _generate(reference, batch, attention_mask=mask, **kw)
    model = _decoder(name)
    model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")
    assert torch.equal(_generate(model, ids, **kw), eager)
    assert torch.equal(_generate(model, batch, attention_mask=mask, **kw), eager_batch)
    subgraphs = embedl_dynamo.last_report().subgraphs
    # prefill and decode, each static then with Dynamo's dynamic sizes (batch, length)
    assert 1 <= len(subgraphs) <= 6, [str(s) for s in subgraphs]
    assert {s.runtime for s in subgraphs} == {"onnxruntime"}, [s.reason for s in subgraphs]
    # other lengths: the static cache's length becomes dynamic once, then no graph is built
    _generate(model, ids, new_tokens=NEW_TOKENS + 5, **kw)
    built = len(embedl_dynamo.last_report().subgraphs)
    _generate(model, ids, new_tokens=NEW_TOKENS + 9, **kw)
    assert len(embedl_dynamo.last_report().subgraphs) == built <= 8
