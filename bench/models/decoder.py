"""The decoder LLM shapes, random weights from their ``Config`` classes (no download).

* :func:`qwen2_0_5b`: the Qwen2.5-0.5B shape (24 layers by default, hidden 896, grouped-query
  attention 14/2, vocabulary 151,936, tied embeddings): the LLM decode suite's model;
* :func:`llama_small`: an 8-layer Llama (hidden 512, 8 heads / 2 key-value heads, vocabulary
  32,000), the small decoder the per-token overhead probe measures.

Their ``*_example`` forms are the registry's factories: the model and a seeded 64-token prompt.
The LLM peers' own environment (optimum-intel) builds the same model from here, so this module
imports only torch and transformers.
"""

from __future__ import annotations

import warnings

import torch

from bench.models.zoo import import_model_libraries

__all__ = [
    "generate",
    "llama_small",
    "llama_small_example",
    "prompt",
    "qwen2_0_5b",
    "qwen2_0_5b_example",
]

PROMPT = 64


def prompt(tokens: int = PROMPT) -> torch.Tensor:
    """A seeded ``[1, tokens]`` prompt of token ids below 1000."""
    return torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))


def generate(model, ids: torch.Tensor, new_tokens: int, **kwargs):
    """Greedy ``model.generate`` of exactly ``new_tokens`` tokens after ``ids``, quietly."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            **kwargs,
        )


def qwen2_0_5b(layers: int = 24):
    """The Qwen2.5-0.5B shape with random weights (seed 0), in eval mode."""
    import_model_libraries()  # the bench extra's torchvision wheel breaks transformers' imports
    import transformers

    config = transformers.Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval()


def llama_small():
    """An 8-layer grouped-query Llama with random weights (seed 0), in eval mode."""
    import_model_libraries()
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def qwen2_0_5b_example():
    """:func:`qwen2_0_5b` (24 layers) and a 64-token prompt."""
    return qwen2_0_5b(), (prompt(),)


def llama_small_example():
    """:func:`llama_small` and a 64-token prompt."""
    return llama_small(), (prompt(),)
