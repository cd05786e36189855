"""transformers models of the zoo, built from their ``Config`` classes at tiny sizes (2 layers,
hidden 16-64, small vocabularies), random weights, nothing downloaded.

Encoders take a padded batch (an attention mask with zeros), as tokenizers give one, so the
mask arithmetic is in the graph; decoders (Llama, Qwen2, Mistral, Phi-3: grouped-query
attention) run their forward without a cache. Whisper is its encoder alone; BART and T5 run
their encoder-decoder forward on a short decoder prompt. Models whose
forward takes the mask in another position, or need a keyword, are called through
:class:`Keywords`. Every name has the ``hf_`` prefix.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn

__all__ = ["MODELS", "Keywords"]

VOCAB = 100
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
VISION = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    image_size=32,
    patch_size=8,
)


class Keywords(nn.Module):
    """Calls ``model`` with its positional inputs passed by ``names`` (and fixed ``options``)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **options: Any) -> None:
        super().__init__()
        self.model, self.names, self.options = model, names, options

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.names, inputs, strict=True)), **self.options)


def _text(length: int = 12, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and an attention mask: the second sample's last 3 tokens are padding."""
    ids = torch.randint(3, VOCAB, (2, length))
    mask = torch.ones(2, length, dtype=torch.long)
    ids[1, -3:], mask[1, -3:] = pad, 0
    return ids, mask


def _pixels(size: int = 32) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, size, size),)


def _encoder(model: str, config: str, pad: int = 0, **kw: Any):
    def build():
        cfg = getattr(transformers, config)(**{**TEXT, "pad_token_id": pad, **kw})
        return getattr(transformers, model)(cfg), _text(pad=pad)

    return build


def _vision(model: str, config: str, size: int = 32, **kw: Any):
    def build():
        return getattr(transformers, model)(getattr(transformers, config)(**kw)), _pixels(size)

    return build


def distilbert():
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64
    )
    return transformers.DistilBertModel(config), _text()


def bart():
    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        use_cache=False,
    )
    ids, mask = _text(pad=config.pad_token_id)
    return transformers.BartModel(config), (ids, mask, torch.randint(3, VOCAB, (2, 7)))


def t5():
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, use_cache=False
    )
    ids, mask = _text()
    return transformers.T5Model(config), (ids, mask, torch.randint(3, VOCAB, (2, 7)))


def whisper_encoder():
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = transformers.WhisperConfig(
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        max_source_positions=16,
    )
    return WhisperEncoder(config), (torch.randn(2, 16, 32),)  # 2 * max_source_positions frames


#: wav2vec2's feature encoder and transformer at tiny sizes (WavLM's config takes them too)
SPEECH = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_kernel=(10, 3),
    conv_stride=(5, 2),
    conv_bias=False,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    feat_extract_norm="group",
)


def wav2vec2():
    config = transformers.Wav2Vec2Config(**SPEECH)
    return transformers.Wav2Vec2Model(config), (torch.randn(2, 400),)


def gpt2():
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return Keywords(transformers.GPT2Model(config), ("input_ids", "attention_mask")), _text()


def _decoder(model: str, config: str, **kw: Any):
    """A causal LM of 2 layers, hidden 64, 4 query and 2 key/value heads (grouped-query)."""

    def build():
        cfg = getattr(transformers, config)(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_cache=False,
            **kw,
        )
        return Keywords(getattr(transformers, model)(cfg), ("input_ids", "attention_mask")), _text()

    return build


def clip_text():
    config = transformers.CLIPTextConfig(
        **{**TEXT, "max_position_embeddings": 16}, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1
    )
    return transformers.CLIPTextModel(config), _text()


def segformer():
    config = transformers.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=3,
    )
    return transformers.SegformerForSemanticSegmentation(config), _pixels()


def longformer():
    """Sliding-window attention over overlapping chunks (``as_strided``), masked in place."""
    config = transformers.LongformerConfig(**TEXT, attention_window=4, pad_token_id=1)
    return transformers.LongformerModel(config), _text(length=16, pad=1)


def cvt():
    """Convolutional attention; its last stage splits a class token off the hidden state."""
    stages = dict(
        patch_sizes=[7, 3],
        patch_stride=[4, 2],
        patch_padding=[2, 1],
        embed_dim=[16, 32],
        num_heads=[1, 2],
        depth=[1, 2],  # CvtStage reads a drop-path rate per stage index: depth > stage
        mlp_ratio=[2.0, 2.0],
        attention_drop_rate=[0.0, 0.0],
        drop_rate=[0.0, 0.0],
        drop_path_rate=[0.0, 0.0],
        qkv_bias=[True, True],
        cls_token=[False, True],
        qkv_projection_method=["dw_bn", "dw_bn"],
        kernel_qkv=[3, 3],
        padding_kv=[1, 1],
        stride_kv=[2, 2],
        padding_q=[1, 1],
        stride_q=[1, 1],
    )
    return transformers.CvtModel(transformers.CvtConfig(**stages)), _pixels()


def wavlm():
    """wav2vec2's feature encoder with gated relative-position attention, called through
    ``F.multi_head_attention_forward`` with separate projection weights."""
    config = transformers.WavLMConfig(**SPEECH, num_buckets=32, max_bucket_distance=100)
    return transformers.WavLMModel(config), (torch.randn(2, 400),)


MODELS = {
    "hf_longformer": longformer,
    "hf_cvt": cvt,
    "hf_wavlm": wavlm,
    "hf_bert": _encoder("BertModel", "BertConfig"),
    "hf_roberta": _encoder("RobertaModel", "RobertaConfig", pad=1),
    "hf_distilbert": distilbert,
    "hf_albert": _encoder("AlbertModel", "AlbertConfig", embedding_size=16),
    "hf_electra": _encoder("ElectraModel", "ElectraConfig", embedding_size=16),
    "hf_deberta_v2": _encoder(
        "DebertaV2Model",
        "DebertaV2Config",
        relative_attention=True,
        position_buckets=8,
        pos_att_type=["p2c", "c2p"],
    ),
    "hf_bart": bart,
    "hf_t5": t5,
    "hf_whisper_encoder": whisper_encoder,
    "hf_wav2vec2": wav2vec2,
    "hf_vit": _vision("ViTModel", "ViTConfig", **VISION),
    "hf_deit": _vision("DeiTModel", "DeiTConfig", **VISION),
    "hf_dinov2": _vision("Dinov2Model", "Dinov2Config", **{**VISION, "mlp_ratio": 2}),
    "hf_clip_vision": _vision("CLIPVisionModel", "CLIPVisionConfig", **VISION),
    "hf_clip_text": clip_text,
    "hf_swin": _vision(
        "SwinModel",
        "SwinConfig",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[2, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    "hf_convnext": _vision(
        "ConvNextModel", "ConvNextConfig", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2
    ),
    "hf_resnet": _vision(
        "ResNetModel",
        "ResNetConfig",
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
    ),
    "hf_segformer": segformer,
    "hf_gpt2": gpt2,
    "hf_llama": _decoder("LlamaForCausalLM", "LlamaConfig"),
    "hf_qwen2": _decoder("Qwen2ForCausalLM", "Qwen2Config"),
    "hf_mistral": _decoder("MistralForCausalLM", "MistralConfig"),
    "hf_phi3": _decoder("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, eos_token_id=None),
}
