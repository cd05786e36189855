"""A Hugging Face decoder's static-cache forward saved and loaded
(:func:`embedl_dynamo.save_compiled`): the step ``aot_compile`` can take (``generate()`` is a
Python loop around it), with the cache written in place as in eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import embedl_dynamo
from tests.helpers import DECODER_VOCAB, tiny_decoder

transformers = pytest.importorskip("transformers")


def _cache(model: torch.nn.Module) -> object:
    return transformers.StaticCache(config=model.config, max_batch_size=1, max_cache_len=16)


@pytest.mark.slow  # a decoder's compile: about 8 s on 2 busy cores
def test_a_static_cache_prefill_saves_and_loads(tmp_path):
    model = tiny_decoder("llama", num_hidden_layers=1)
    ids = torch.randint(0, DECODER_VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    position = torch.arange(6)

    def step(cache: object) -> dict:
        return {"past_key_values": cache, "cache_position": position, "use_cache": True}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedl_dynamo.save_compiled(
            model,
            (ids,),
            tmp_path / "prefill.pt",
            backend="embedl_onnxruntime",
            example_kwargs=step(_cache(model)),
        )
        # torch 2.13 saves a module the bytecode reads through an installed global by neither
        # name nor value: without importing it by name, this load fails
        loaded = embedl_dynamo.load_compiled(tmp_path / "prefill.pt", model)
        ours, eager = _cache(model), _cache(model)
        with torch.no_grad():
            got, want = loaded(ids, **step(ours)), model(ids, **step(eager))
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.layers[0].keys, eager.layers[0].keys, rtol=1e-4, atol=1e-5)
    assert loaded.report.loaded == "loaded"
