"""Attention as decoders write it (issue 24): Llama, Qwen2, Mistral, Phi-3 and GPT-2 compile fully.

Tiny random-init ``*ForCausalLM`` models of transformers' own classes (no download). A prefill
forward compiles as one graph (``fullgraph=True``: no graph break) that runs on the target's
runtime (``fallback="raise"``: no subgraph left in PyTorch), so rotary embeddings, RMSNorm,
SwiGLU and the causal / sliding-window masks run inside the compiled artifact; its logits equal
eager's within the float bound, and every attention is fused. Grouped-query attention comes in
both of transformers' forms: SDPA's ``enable_gqa`` (no mask) and ``repeat_kv`` before plain SDPA
(with a mask: Mistral's sliding window, left padding); multi-query attention is one key/value
head. Attention written out op by op (``attn_implementation="eager"``) is fused too. Greedy ``generate()`` of Mistral and Phi-3 gives eager's tokens with the dynamic and the
static cache.
"""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from tests.helpers import (
    DECODER_VOCAB,
    assert_close_to_scale,
    greedy_generate,
    left_padded_batch,
    tiny_decoder,
)

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 6
LAYERS = 2
PROMPT = 10  # longer than Mistral's sliding window, so the window matters


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_embd=64,
        n_layer=LAYERS,
        n_head=4,
        vocab_size=DECODER_VOCAB,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _model(name: str, kv_heads: int, config: dict) -> torch.nn.Module:
    return _gpt2() if name == "gpt2" else tiny_decoder(name, kv_heads, **config)


def _applied(pattern: str) -> list[bool]:
    """Whether each match of ``pattern`` in the last report's plans is applied (a conversion
    while planning, a fusion when the plan is applied)."""
    subgraphs = embedl_dynamo.last_report().subgraphs
    return [
        e.apply for s in subgraphs if s.plan for e in s.plan.entries if e.pattern.name == pattern
    ]


def _declined(pattern: str) -> list[str]:
    """The reasons of the last report's matches of ``pattern`` that were not applied."""
    subgraphs = embedl_dynamo.last_report().subgraphs
    return [
        e.reason
        for s in subgraphs
        if s.plan
        for e in s.plan.entries
        if e.pattern.name == pattern and not e.apply
    ]


def _assert_fully_compiled(runtimes: set[str]) -> None:
    subgraphs = embedl_dynamo.last_report().subgraphs
    assert subgraphs, "nothing compiled"
    assert all(s.status == "compiled" for s in subgraphs), [s.reason for s in subgraphs]
    assert {s.runtime for s in subgraphs} <= runtimes, [(s.runtime, s.reason) for s in subgraphs]


WINDOW = {"sliding_window": 4}
EAGER = {"attn_implementation": "eager"}
# (model, key/value heads, config fields, backend): each backend at least once, multi-query
# (one key/value head) on a grouped-query model, Phi-3 with a partial and a full rotary
PREFILL = [
    ("llama", 2, {}, "embedl_onnxruntime"),
    ("llama", 1, {}, "embedl_openvino"),
    # slow (CI's slow slice): Qwen2 is Llama's form with biased projections
    pytest.param("qwen2", 2, {}, "embedl_onnxruntime", marks=pytest.mark.slow),
    ("mistral", 2, WINDOW, "embedl_onnxruntime"),
    ("mistral", 1, WINDOW, "embedl_tensorrt"),
    ("phi3", 2, {"partial_rotary_factor": 0.5}, "embedl_onnxruntime"),
    # slow: the full rotary runs by default in test_greedy_tokens_equal_eager[phi3]
    pytest.param("phi3", 4, {}, "embedl_tensorrt", marks=pytest.mark.slow),
    # slow: GPT-2's attention compiles by default in tests/dynamo/test_hf_transformers.py
    pytest.param("gpt2", 4, {}, "embedl_onnxruntime", marks=pytest.mark.slow),
    # attention written out (transformers' "eager"): repeat_kv, matmul, softmax, matmul
    ("llama", 2, EAGER, "embedl_onnxruntime"),
]
# what each backend runs on a CPU (the tensorrt target picks a CPU runtime without a GPU)
RUNTIMES = {
    "embedl_onnxruntime": {"onnxruntime"},
    "embedl_openvino": {"openvino"},
    "embedl_tensorrt": {"onnxruntime", "openvino", "tensorrt", "torch_tensorrt"},
}


@pytest.mark.parametrize(("name", "kv_heads", "config", "backend"), PREFILL)
def test_prefill_compiles_as_one_graph_with_fused_attention(name, kv_heads, config, backend):
    model = _model(name, kv_heads, config)
    ids = torch.randint(0, DECODER_VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend=backend, fullgraph=True, options={"fallback": "raise"})
    with torch.no_grad():
        expected = model(ids).logits
        out = compiled(ids).logits
    assert_close_to_scale(out, expected)
    _assert_fully_compiled(RUNTIMES[backend])
    grouped = _applied("grouped_query_attention")
    assert (_applied("scaled_dot_product_attention") + grouped).count(True) == LAYERS
    if config == EAGER:
        assert _applied("explicit_attention_masked") == [True] * LAYERS
    elif 1 < kv_heads < 4 and "sliding_window" not in config:
        # no mask: transformers asks SDPA for grouped-query attention, which is expanded first
        # (the expanded SDPA is planned again, and declined: no longer grouped-query); the
        # onnxruntime target then fuses it over the K/V heads themselves (no repeated copies)
        assert _applied("expand_grouped_kv").count(True) == LAYERS
        assert grouped.count(True) == (LAYERS if backend == "embedl_onnxruntime" else 0)


def test_the_sliding_window_changes_mistral_logits():
    """The prefill test's prompt is longer than the window: a lost window would show."""
    ids = torch.randint(0, DECODER_VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        windowed = tiny_decoder("mistral", **WINDOW)(ids).logits
        full = tiny_decoder("mistral", sliding_window=None)(ids).logits
    assert torch.equal(windowed[:, :4], full[:, :4])
    assert (windowed[:, 4:] - full[:, 4:]).abs().max() > 1e-3


# each architecture with one cache, each cache once (test_generate.py: llama and qwen2 with both);
# both slow (about 8-10 s each), in CI's slow slice: the static cache with a left-padded batch
# also runs in test_generate.py (llama on OpenVINO), the masked repeat_kv form here with phi3
GENERATE = [
    pytest.param("mistral", WINDOW, "static", marks=pytest.mark.slow),
    pytest.param("phi3", {}, "dynamic", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "config", "cache"), GENERATE, ids=["mistral", "phi3"])
def test_greedy_tokens_equal_eager(name, config, cache):
    """Batch 1, then a left-padded batch of 2 (the masked ``repeat_kv`` form), through one
    compiled forward: the prefill and the decode steps all run on ONNX Runtime."""
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ids = torch.randint(0, DECODER_VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    batch, mask = left_padded_batch()
    reference = tiny_decoder(name, **config)
    eager = greedy_generate(reference, ids, NEW_TOKENS, **kw)
    eager_batch = greedy_generate(reference, batch, NEW_TOKENS, attention_mask=mask, **kw)
    model = tiny_decoder(name, **config)
    model.forward = torch.compile(
        model.forward, backend="embedl_onnxruntime", options={"fallback": "raise"}
    )
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS, **kw), eager)
    assert torch.equal(
        greedy_generate(model, batch, NEW_TOKENS, attention_mask=mask, **kw), eager_batch
    )
    _assert_fully_compiled({"onnxruntime"})
    # prefill and decode, static then dynamic: no recompile per token (the cache's int length
    # once specialized every decode step)
    assert len(embedl_dynamo.last_report().subgraphs) <= 6
    assert _applied("scaled_dot_product_attention") + _applied("grouped_query_attention")
    # every attention fused: an SDPA left unfused only where the grouped fusion took it
    assert not [
        r
        for r in _declined("scaled_dot_product_attention")
        if not r.startswith("overlaps grouped_query_attention@")
    ]


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_dynamic_true_compiles_grouped_query_attention_too():
    """``torch.compile(..., dynamic=True)``: sizes are symbolic from the first trace, and the
    rewrites run inside a Dynamo tracing context whose fake mode is not that of the graph's
    example values. The shapes the grouped-query rules check must still be known (they were
    lost, and every subgraph fell back to PyTorch on the exporter's missing ``enable_gqa``)."""
    ids = torch.randint(0, DECODER_VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    eager = greedy_generate(tiny_decoder("qwen2", 2), ids, NEW_TOKENS)
    model = tiny_decoder("qwen2", 2)
    model.forward = torch.compile(
        model.forward, backend="embedl_onnxruntime", dynamic=True, options={"fallback": "raise"}
    )
    assert torch.equal(greedy_generate(model, ids, NEW_TOKENS), eager)
    _assert_fully_compiled({"onnxruntime"})
    graphs = len(embedl_dynamo.last_report().subgraphs)  # prefill and decode
    assert _applied("expand_grouped_kv").count(True) == LAYERS * graphs
    assert _applied("grouped_query_attention") == [True] * LAYERS * graphs
