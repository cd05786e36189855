"""Attention-era vision and MLP models of the zoo, hand-written in plain ``torch.nn``: a ConvNeXt,
a Swin stage with shifted windows, a MobileViT-style hybrid, an MLP-Mixer, an RMSNorm SwiGLU
MLP, and the ViT, ``nn.TransformerEncoder`` and graph-break models of :mod:`tests.models`.

They hold the idioms that decide coverage in such models: a channels-last LayerNorm between
permutes, ``torch.roll``, padding to a multiple of the window, window partition by view and
permute, a relative-position bias gathered by index, a shifted-window mask, strided-slice patch
merging, ``nn.RMSNorm``, and a Dynamo graph break.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.models import GraphBreakNet, TransformerEncoderNet, ViTLike

__all__ = ["MODELS"]


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, permute to channels-last, LayerNorm, 4x MLP with GELU, layer scale."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.mlp(self.norm(y))
        return x + y.permute(0, 3, 1, 2)


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's channels-first LayerNorm: permute, normalise the last axis, permute back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def convnext():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 4, 4),
        LayerNorm2d(16, eps=1e-6),
        ConvNeXtBlock(16),
        LayerNorm2d(16, eps=1e-6),
        nn.Conv2d(16, 32, 2, 2),
        ConvNeXtBlock(32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.LayerNorm(32),
        nn.Linear(32, 10),
    )
    return model, (torch.randn(2, 3, 32, 32),)


class WindowAttention(nn.Module):
    """Swin's (shifted) window attention over a channels-last map with a relative-position bias.

    The map is padded to a multiple of the window, rolled by half a window when ``shift``,
    split into windows, attended within each (with the shifted-window mask), merged, rolled
    back and cropped.
    """

    def __init__(self, dim: int, heads: int, window: int, shift: bool, size: int) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.shift = window // 2 if shift else 0
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(
            torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        ).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("bias_index", rel[..., 0] * (2 * window - 1) + rel[..., 1], False)
        self.register_buffer("mask", self._shift_mask(-(-size // window) * window), False)

    def _shift_mask(self, padded: int) -> torch.Tensor:
        """-100 where two positions of a shifted window come from different regions."""
        region = torch.zeros(1, padded, padded, 1)
        if self.shift:
            cuts = (
                slice(0, -self.window),
                slice(-self.window, -self.shift),
                slice(-self.shift, None),
            )
            for k, (rows, cols) in enumerate((r, c) for r in cuts for c in cuts):
                region[:, rows, cols, :] = k
        ids = self._partition(region).squeeze(-1)
        return (ids[:, None, :] - ids[:, :, None]).ne(0).float() * -100.0

    def _partition(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        n = self.window
        x = x.view(b, h // n, n, w // n, n, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, n * n, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        n = self.window
        x = F.pad(x, (0, 0, 0, (n - w % n) % n, 0, (n - h % n) % n))
        hp, wp = x.shape[1], x.shape[2]
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        windows = self._partition(x)
        qkv = self.qkv(windows).reshape(windows.shape[0], n * n, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.bias_table[self.bias_index.view(-1)].view(n * n, n * n, -1).permute(2, 0, 1)
        mask = self.mask.repeat(b, 1, 1)[:, None] + bias[None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.proj(out.transpose(1, 2).reshape(-1, n, n, c))
        out = out.view(b, hp // n, wp // n, n, n, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        if self.shift:
            out = torch.roll(out, shifts=(self.shift, self.shift), dims=(1, 2))
        return out[:, :h, :w, :].contiguous()


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: bool, size: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window, shift, size)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    """Patch embedding to a 10x10 map (padded to 12 for 4x4 windows), a plain and a shifted
    block, patch merging by strided slices, a pooled head."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.Sequential(SwinBlock(dim, 2, 4, False, 10), SwinBlock(dim, 2, 4, True, 10))
        self.merge_norm, self.merge = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)
        self.head = nn.Linear(2 * dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.embed(x).permute(0, 2, 3, 1))
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        x = self.merge(self.merge_norm(torch.cat(parts, -1)))
        return self.head(x.mean((1, 2)))


class MobileViTBlock(nn.Module):
    """Local 3x3 conv, unfold into 2x2 patches by reshape, a transformer layer across patches,
    fold back, fuse with the input by concatenation."""

    def __init__(self, channels: int, dim: int, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.local = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU(), nn.Conv2d(channels, dim, 1)
        )
        self.transformer = nn.TransformerEncoderLayer(
            dim, 2, 2 * dim, 0.0, "gelu", batch_first=True, norm_first=True
        )
        self.back = nn.Conv2d(dim, channels, 1)
        self.fuse = nn.Sequential(nn.Conv2d(2 * channels, channels, 3, padding=1), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        b, d, h, w = y.shape
        p = self.patch
        y = y.reshape(b, d, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1)
        y = self.transformer(y.reshape(b * p * p, (h // p) * (w // p), d))
        y = y.reshape(b, p, p, h // p, w // p, d).permute(0, 5, 3, 1, 4, 2).reshape(b, d, h, w)
        return self.fuse(torch.cat([x, self.back(y)], 1))


def hybrid_conv_attention():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1),
        nn.BatchNorm2d(16),
        nn.SiLU(),
        nn.Conv2d(16, 16, 3, 2, 1, groups=16),
        nn.BatchNorm2d(16),
        nn.SiLU(),
        MobileViTBlock(16, 24),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, (torch.randn(2, 3, 32, 32),)


class MixerBlock(nn.Module):
    """Token mixing (an MLP across patches, between transposes), then channel mixing."""

    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tokens = nn.Sequential(
            nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens)
        )
        self.channels = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, dim: int = 32, patch: int = 4, image: int = 32) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(MixerBlock(tokens, dim), MixerBlock(tokens, dim))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


class SwiGLU(nn.Module):
    """Pre-norm (``nn.RMSNorm``) gated MLP with a residual: x + down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def rmsnorm_mlp():
    model = nn.Sequential(
        nn.Linear(16, 32),
        SwiGLU(32, 64),
        SwiGLU(32, 64),
        nn.RMSNorm(32),
        nn.Linear(32, 10),
    )
    return model, (torch.randn(2, 8, 16),)


MODELS = {
    "convnext": convnext,
    "swin": lambda: (Swin(), (torch.randn(2, 3, 40, 40),)),
    "hybrid_conv_attention": hybrid_conv_attention,
    "mlp_mixer": lambda: (MLPMixer(), (torch.randn(2, 3, 32, 32),)),
    "rmsnorm_mlp": rmsnorm_mlp,
    "vit": lambda: (ViTLike(), (torch.randn(2, 3, 16, 16),)),
    "transformer_encoder": lambda: (TransformerEncoderNet(), (torch.randn(2, 6, 16),)),
    "graph_break": lambda: (GraphBreakNet(), (torch.randn(2, 3, 16, 16),)),
}
