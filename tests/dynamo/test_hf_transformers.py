"""HF transformers (random weights, small configs) through ``embedl_tensorrt``: padding masks,
causal attention, changing sequence lengths and GPT-2's KV cache.

Padded positions carry no meaning, so outputs are compared with eager on the valid ones.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.backends.tensorrt import TENSORRT_PATTERNS
from embedl_dynamo.patterns.attention import FusedAttention
from tests.helpers import BUILD_COUNTS

if importlib.util.find_spec("torchvision") is not None:  # transformers imports it if present
    from bench.models.zoo import import_model_libraries

    import_model_libraries()
transformers = pytest.importorskip("transformers")

VOCAB = 500


def _padded(batch: int, length: int, pad_left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad_left:
        mask[0, : length // 4] = 0
    else:
        mask[0, length // 2 :] = 0  # the first sequence is half padding
    return ids, mask


def _compile(model, tmp_path):
    options = {"cache_dir": str(tmp_path), "fallback": "raise"}
    return torch.compile(model, backend="embedl_tensorrt", options=options)


def _masked_attention_fused() -> bool:
    entries = [e for s in embedl_dynamo.last_report() if s.plan for e in s.plan.entries]
    attention = [e for e in entries if e.pattern.name == "scaled_dot_product_attention"]
    return bool(attention) and all(e.apply for e in attention)


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_padded_bert_matches_eager_and_new_lengths_build_nothing(tmp_path):
    config = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
    )
    model = transformers.BertModel(config).eval()
    compiled = _compile(model, tmp_path)
    builds = []
    with torch.inference_mode():
        for length in (32, 48, 64, 80):
            ids, mask = _padded(2, length)
            out = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
            valid = mask.bool()
            torch.testing.assert_close(out[valid], expected[valid], rtol=1e-4, atol=1e-5)
            builds.append(BUILD_COUNTS.get("onnx", 0))
            assert _masked_attention_fused()  # the plan no longer declines masked attention
    # the first length builds, Dynamo's one recompile (a symbolic length) builds once more,
    # and every later length runs that dynamic artifact
    assert builds[3] == builds[1] and builds[1] > builds[0]


@pytest.mark.slow  # in CI's slow slice; DistilBERT compiles in the default run
def test_bert_under_dynamic_true_compiles(tmp_path):
    """Regression (issue 23 item 14): with dynamic=True, HF BERT ran in PyTorch (SDPA's scale
    a graph value, then every float attribute an input the exported file dropped)."""
    config = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=VOCAB,
    )
    model = transformers.BertModel(config).eval()
    options = {"cache_dir": str(tmp_path), "fallback": "raise"}
    compiled = torch.compile(model, backend="embedl_onnxruntime", dynamic=True, options=options)
    with torch.inference_mode():
        for length in (8, 12):
            ids, mask = _padded(2, length)
            out = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
            valid = mask.bool()
            torch.testing.assert_close(out[valid], expected[valid], rtol=1e-4, atol=1e-5)
    assert {s.runtime for s in embedl_dynamo.last_report().subgraphs} == {"onnxruntime"}


def test_padded_distilbert_matches_eager(tmp_path):
    config = transformers.DistilBertConfig(
        dim=64, n_layers=2, n_heads=2, hidden_dim=128, vocab_size=VOCAB
    )
    model = transformers.DistilBertModel(config).eval()
    ids, mask = _padded(2, 24)
    with torch.inference_mode():
        out = _compile(model, tmp_path)(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out[mask.bool()], expected[mask.bool()], rtol=1e-4, atol=1e-5)
    assert _masked_attention_fused()


def _gpt2():
    config = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def test_gpt2_causal_attention_takes_the_causal_form():
    model = _gpt2()
    ids = torch.randint(0, VOCAB, (1, 12))
    result = embedl_dynamo.transform(model, (ids,), TENSORRT_PATTERNS)
    fused = [m for m in result.model.modules() if isinstance(m, FusedAttention)]
    assert len(fused) == 2 and all(m.is_causal for m in fused)


def test_gpt2_left_padding_matches_eager(tmp_path):
    model = _gpt2()
    ids, mask = _padded(2, 16, pad_left=True)
    with torch.inference_mode():
        out = _compile(model, tmp_path)(input_ids=ids, attention_mask=mask, use_cache=False)
        expected = model(input_ids=ids, attention_mask=mask, use_cache=False)
    valid = mask.bool()
    torch.testing.assert_close(out.logits[valid], expected.logits[valid], rtol=1e-4, atol=1e-4)
    assert _masked_attention_fused()


@pytest.mark.slow  # about 8 s; decoding with a cache by default: test_decoders.py (phi3, the
# dynamic cache), test_generate.py (the static cache)
def test_gpt2_with_kv_cache_decodes_like_eager(tmp_path):
    """``use_cache=True``: a prompt, then one token at a time with ``past_key_values``."""
    model = _gpt2()
    compiled = _compile(model, tmp_path)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out, expected = (
            compiled(input_ids=ids, use_cache=True),
            model(input_ids=ids, use_cache=True),
        )
        for _ in range(3):
            torch.testing.assert_close(out.logits, expected.logits, rtol=1e-4, atol=1e-4)
            token = expected.logits[:, -1:].argmax(-1)
            out = compiled(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            expected = model(
                input_ids=token, past_key_values=expected.past_key_values, use_cache=True
            )
        torch.testing.assert_close(out.logits, expected.logits, rtol=1e-4, atol=1e-4)
    runtimes = {s.runtime for s in embedl_dynamo.last_report()}
    assert "onnxruntime" in runtimes, [(s.runtime, s.reason) for s in embedl_dynamo.last_report()]
