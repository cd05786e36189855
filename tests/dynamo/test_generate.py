"""Decoder LLMs generate through the backend (issue 24): greedy tokens equal eager's.

Tiny random-init configs of transformers' own model classes (no download). With the dynamic cache
the prefill and the decode steps compile (grouped-query attention included) into a bounded number
of graphs; the static cache writes its buffers in place, so that graph runs in PyTorch with the
warning, and its tokens are still eager's.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import embedl_dynamo

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12


def _decoder(name: str, kv_heads: int = 2):
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=kv_heads, vocab_size=100)  # fmt: skip
    config, cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[name]
    torch.manual_seed(0)
    return cls(config(**kw)).eval()


def _generate(model, ids, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, **kw)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_tokens_with_the_dynamic_cache_equal_eager_and_compile(name):
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    eager = _generate(_decoder(name), ids)
    model = _decoder(name)
    model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")
    assert torch.equal(_generate(model, ids), eager)
    subgraphs = embedl_dynamo.last_report().subgraphs
    # prefill, the first decode step, and the decode step Dynamo made dynamic: no rebuild per step
    assert 1 <= len(subgraphs) <= 3, [str(s) for s in subgraphs]
    assert {s.runtime for s in subgraphs} == {"onnxruntime"}, [s.reason for s in subgraphs]


def test_greedy_tokens_with_the_static_cache_equal_eager():
    """The static cache's in-place writes are kept (the graph runs in PyTorch, with the warning);
    they were lost before, giving other tokens from the first one."""
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    eager = _generate(_decoder("llama", kv_heads=4), ids, cache_implementation="static")
    model = _decoder("llama", kv_heads=4)  # multi-head: the export worked, the writes were lost
    model.forward = torch.compile(model.forward, backend="embedl_onnxruntime")
    assert torch.equal(_generate(model, ids, cache_implementation="static"), eager)
