"""``generate()`` builds graphs per shape class, not per call (issue 41 item 4).

A second ``generate()`` with the shapes of the first builds no graph: Dynamo's guards accept
every input, so our backend is not called again. Under ``torch.inference_mode`` they once did
not: Dynamo compiles outside inference mode, and the first call of every compiled graph
returned the outputs of the build's check, ordinary tensors, where eager returns inference
tensors. They became the model's KV cache, Dynamo's guards on the next calls' dispatch keys
then failed on the inference tensors of every later ``generate()``, and each graph was built
again: the static cache's decode graph, all three graphs of T5 and BART. Tiny random-init
models of transformers' own classes (no download); tokens equal eager's.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embedl_dynamo
from tests.helpers import DECODER_VOCAB, greedy_generate, tiny_decoder

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 6


def _graphs() -> int:
    """The graphs Dynamo handed our backend for the compiled ``forward``, so far."""
    return len(embedl_dynamo.last_report().subgraphs)


def _prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(
        3, DECODER_VOCAB, (1, length), generator=torch.Generator().manual_seed(seed)
    )


def _generate(model: nn.Module, ids: torch.Tensor, new_tokens: int, **kw) -> torch.Tensor:
    """Greedy tokens under ``torch.inference_mode``, exactly ``new_tokens`` of them."""
    with torch.inference_mode():
        return greedy_generate(model, ids, new_tokens, min_new_tokens=new_tokens, **kw)


def _compiled(make, backend: str = "embedl_onnxruntime") -> tuple[nn.Module, nn.Module]:
    """An eager model and its twin (same weights) whose ``forward`` is compiled."""
    model = make()
    model.forward = torch.compile(model.forward, backend=backend)
    return make(), model


def _t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=DECODER_VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def _bart() -> nn.Module:
    config = transformers.BartConfig(
        vocab_size=DECODER_VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(config).eval()


@pytest.mark.slow  # in CI's slow slice: the default run keeps to 5 minutes
def test_a_static_cache_decoder_builds_per_shape_class():
    """Llama (one layer) with grouped-query attention and the static cache: the first ``generate()``
    builds the prefill and decode graphs, the second none; another ``max_new_tokens`` (a cache
    of another length) makes Dynamo's sizes dynamic once, after which another prompt length
    and another ``max_new_tokens`` build none."""
    kw = {"cache_implementation": "static"}
    eager, model = _compiled(lambda: tiny_decoder("llama", num_hidden_layers=1))
    calls = [
        (_prompt(8), NEW_TOKENS),
        (_prompt(8, 2), NEW_TOKENS),
        (_prompt(8), NEW_TOKENS + 3),
        (_prompt(11), NEW_TOKENS + 7),
    ]
    built = []
    for ids, new_tokens in calls:
        before = _graphs()
        assert torch.equal(
            _generate(model, ids, new_tokens, **kw), _generate(eager, ids, new_tokens, **kw)
        )
        built.append(_graphs() - before)
    assert built[0] == 2 and built[1] == 0, built  # prefill and decode, then nothing
    assert built[3] == 0, built  # after the dynamic recompile of built[2]


# both slow (about 5-8 s each), in CI's slow slice
@pytest.mark.slow
@pytest.mark.parametrize("make", [_t5, _bart], ids=["t5", "bart"])
def test_an_encoder_decoder_builds_nothing_in_its_second_generate(make):
    """T5 and BART: the first greedy ``generate()`` builds the graphs of the first decoding
    step (which fills the cross-attention cache), the second and the later steps; a second
    ``generate()`` of another prompt of the same length builds none, nor does one of more
    tokens (the later steps' graph already takes any cache length)."""
    eager, model = _compiled(make)
    built = []
    for ids, new_tokens in (
        (_prompt(10), NEW_TOKENS),
        (_prompt(10, 2), NEW_TOKENS),
        (_prompt(10), NEW_TOKENS + 3),
    ):
        before = _graphs()
        assert torch.equal(_generate(model, ids, new_tokens), _generate(eager, ids, new_tokens))
        built.append(_graphs() - before)
    assert built == [3, 0, 0], built


class _Step(nn.Module):
    """A new tensor, a view of an input written in place, and an input returned."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, cache):
        cache.add_(1)
        return self.linear(x).relu(), cache[0], x


@pytest.mark.parametrize("backend", ["embedl_onnxruntime", "embedl_openvino", "embedl_tensorrt"])
def test_outputs_are_inference_tensors_under_inference_mode_from_the_first_call(backend):
    """As eager's, the first call's outputs included, whatever the runtime; so a later call
    whose inputs are the outputs of earlier ones compiles nothing new."""
    eager, model = _Step().eval(), _Step().eval()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend=backend)
    with torch.inference_mode():
        x = torch.randn(2, 4)
        for _ in range(3):
            out = compiled(x, torch.zeros(3, 4))
            expected = eager(x, torch.zeros(3, 4))
            assert [t.is_inference() for t in out] == [True, True, True]
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
            x = out[0]  # an output as the next input, as a KV cache is
    assert _graphs() == 1
    assert embedl_dynamo.last_report().subgraphs[0].runtime is not None
