"""Weight-only int8/int4 on a causal LM trained on real text (issue 24): held-out perplexity.

A tiny byte-level Llama (vocabulary 256) is trained for a few seconds on the source of a few of
the standard library's own modules (real text that ships with Python: no download), and scored
on another module it never saw. Through the backend, the weight-only precisions must stay close
to float perplexity: int8 within +1%; int4 within +5%, or the accuracy budget keeps layers at
8 bits and reports them. In fp32 the compiled model's greedy tokens are eager's.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import embedl_dynamo

transformers = pytest.importorskip("transformers")

TRAIN_FILES = ("os.py", "functools.py", "contextlib.py")
HELD_OUT_FILE = "textwrap.py"
SEQ, BATCH, STEPS = 64, 8, 150


def _bytes(name: str) -> torch.Tensor:
    with open(os.path.join(os.path.dirname(os.__file__), name), "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.long)


@pytest.fixture(scope="module")
def trained():
    """A 2-layer, hidden-64 Llama trained on the training files' bytes (seeded)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(config)
    data = torch.cat([_bytes(name) for name in TRAIN_FILES])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is faster than two contending
    try:
        for _ in range(STEPS):
            start = torch.randint(0, len(data) - SEQ, (BATCH,), generator=generator)
            batch = torch.stack([data[i : i + SEQ] for i in start.tolist()])
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    held_out = _bytes(HELD_OUT_FILE)[: 8 * 2 * SEQ].reshape(8, 2 * SEQ)
    return model.eval(), held_out


def _perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256).float(), ids[:, 1:].reshape(-1))
    return math.exp(loss.item())


def _compiled_perplexity(model, ids, precision: str, cache_dir) -> tuple[float, dict]:
    options = {"precision": precision, "weight_only_group_size": 32, "cache_dir": str(cache_dir)}
    logits = torch.compile(
        lambda x: model(input_ids=x, use_cache=False).logits,
        backend="embedl_onnxruntime",
        options=options,
    )
    with torch.no_grad():
        result = _perplexity(logits(ids), ids)
    (subgraph,) = embedl_dynamo.last_report().subgraphs
    assert subgraph.runtime == "onnxruntime", subgraph.reason
    assert "rejected" not in subgraph.reason  # the judge took the lower precision
    return result, subgraph.pipeline


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_weight_only_perplexity_stays_near_float(trained, tmp_path):
    model, ids = trained
    with torch.no_grad():
        float_ppl = _perplexity(model(input_ids=ids).logits, ids)
    assert float_ppl < 40  # it learned the text (uniform bytes: 256)
    int8_ppl, int8_report = _compiled_perplexity(model, ids, "int8_weight_only", tmp_path)
    assert int8_report["precision"] == "int8_weight_only"
    assert {r["precision"] for r in int8_report["layers"]} == {"int8_weight_only"}
    assert int8_ppl <= 1.01 * float_ppl, (int8_ppl, float_ppl)
    torch._dynamo.reset()
    int4_ppl, int4_report = _compiled_perplexity(model, ids, "int4_weight_only", tmp_path)
    layers = {r["id"]: r["precision"] for r in int4_report["layers"]}
    assert "int4_weight_only" in layers.values()
    kept = int4_report["weight_only"]["kept_int8"]
    # the head is tried in int4 under the budget; it has 8 bits only where the budget kept it
    (head,) = [i for i in layers if "lm_head" in i]
    assert (layers[head] == "int8_weight_only") == (head in kept), (layers[head], kept)
    # within +5% of float, or the budget kept layers at 8 bits and the report says which
    assert int4_ppl <= 1.05 * float_ppl or kept, (int4_ppl, float_ppl)


@pytest.mark.slow  # about 7 s; greedy tokens equal eager's by default in test_decoders.py and
# test_generate.py (random-init decoders)
def test_greedy_tokens_in_fp32_equal_eager(trained, tmp_path):
    model, ids = trained
    prompt = ids[:1, :16]
    kw = dict(max_new_tokens=12, do_sample=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = model.generate(prompt, **kw)
        forward = model.forward
        model.forward = torch.compile(
            forward, backend="embedl_onnxruntime", options={"cache_dir": str(tmp_path)}
        )
        try:
            compiled = model.generate(prompt, **kw)
        finally:
            model.forward = forward
    assert torch.equal(compiled, eager)
    assert {s.runtime for s in embedl_dynamo.last_report().subgraphs} == {"onnxruntime"}
