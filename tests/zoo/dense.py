"""Dense-prediction and generative models of the zoo, hand-written in plain ``torch.nn``: a UNet,
an FPN, a YOLO-style neck, DeepLab's ASPP head, a diffusion UNet, a DCGAN-style decoder, an
ESPCN super-resolution net and a style-transfer net.

They hold the layers issue 50 found kept in PyTorch on unseen models: ``GroupNorm``,
``F.interpolate`` (nearest and bilinear), ``F.pad``, ``LeakyReLU``, ``ConvTranspose2d``,
``PixelShuffle``, ``InstanceNorm2d`` and reflection padding, each in the place its namesake
puts it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS"]


def _image(size: int = 32, channels: int = 3) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, channels, size, size),)


def _gn_block(cin: int, cout: int) -> nn.Module:
    """Conv, GroupNorm, ReLU twice (UNet's double conv)."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.GroupNorm(4, cout),
        nn.ReLU(True),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.GroupNorm(4, cout),
        nn.ReLU(True),
    )


class UNet(nn.Module):
    """Two down steps, bilinear upsampling, ``F.pad`` to the skip's size, concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.ModuleList([_gn_block(3, 8), _gn_block(8, 16), _gn_block(16, 32)])
        self.dec = nn.ModuleList([_gn_block(48, 16), _gn_block(24, 8)])
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.enc):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for block, skip in zip(self.dec, reversed(skips[:-1])):
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
            dy, dx = skip.shape[2] - x.shape[2], skip.shape[3] - x.shape[3]
            x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
            x = block(torch.cat([skip, x], 1))
        return self.out(x)


class FPN(nn.Module):
    """A three-stage backbone, 1x1 laterals, nearest top-down upsampling, 3x3 smoothing."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
            )

        self.stages = nn.ModuleList([stage(3, 16), stage(16, 32), stage(32, 64)])
        self.lateral = nn.ModuleList([nn.Conv2d(c, width, 1) for c in (16, 32, 64)])
        self.smooth = nn.ModuleList([nn.Conv2d(width, width, 3, padding=1) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        top = self.lateral[2](features[2])
        outs = [self.smooth[2](top)]
        for i in (1, 0):
            lateral = self.lateral[i](features[i])
            top = lateral + F.interpolate(top, size=lateral.shape[-2:], mode="nearest")
            outs.insert(0, self.smooth[i](top))
        return outs


def _cbl(cin: int, cout: int, k: int = 1, s: int = 1) -> nn.Module:
    """YOLO's conv-BN-LeakyReLU(0.1)."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1)
    )


class YOLONeck(nn.Module):
    """A small backbone, SPPF, a PAN-style neck (nearest upsampling, concatenation) and two
    detection heads decoded with view, permute and sigmoid."""

    def __init__(self, anchors: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.anchors, self.outputs = anchors, 5 + classes
        self.c3 = nn.Sequential(_cbl(3, 16, 3, 2), _cbl(16, 32, 3, 2), _cbl(32, 32, 3))
        self.c4 = nn.Sequential(_cbl(32, 64, 3, 2), _cbl(64, 64, 3))
        self.sppf_in, self.sppf_out = _cbl(64, 32), _cbl(128, 64)
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.reduce, self.merge = _cbl(64, 32), _cbl(64, 32, 3)
        self.heads = nn.ModuleList([nn.Conv2d(c, anchors * self.outputs, 1) for c in (32, 64)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        p3 = self.c3(x)
        y = self.sppf_in(self.c4(p3))
        y1 = self.pool(y)
        y2 = self.pool(y1)
        p4 = self.sppf_out(torch.cat([y, y1, y2, self.pool(y2)], 1))
        p3 = self.merge(torch.cat([self.up(self.reduce(p4)), p3], 1))
        outs = []
        for head, feature in zip(self.heads, (p3, p4)):
            out = head(feature)
            b, _, h, w = out.shape
            out = out.view(b, self.anchors, self.outputs, h, w).permute(0, 1, 3, 4, 2)
            outs.append(out.sigmoid().reshape(b, -1, self.outputs))
        return torch.cat(outs, 1)


class ASPP(nn.Module):
    """DeepLabV3's head: dilated 3x3 branches, image pooling upsampled bilinearly, projection."""

    def __init__(self, cin: int = 32, width: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.backbone = nn.Sequential(_cbl(3, 16, 3, 2), _cbl(16, cin, 3, 2))
        self.branches = nn.ModuleList([nn.Conv2d(cin, width, 1)])
        self.branches.extend(nn.Conv2d(cin, width, 3, padding=d, dilation=d) for d in (2, 3))
        self.image_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, width, 1))
        self.project = nn.Sequential(
            nn.Conv2d(4 * width, width, 1), nn.BatchNorm2d(width), nn.ReLU(), nn.Dropout(0.1)
        )
        self.classifier = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        f = self.backbone(x)
        pooled = F.interpolate(self.image_pool(f), size=f.shape[-2:], mode="bilinear")
        y = self.project(torch.cat([b(f) for b in self.branches] + [pooled], 1))
        return F.interpolate(self.classifier(y), size=size, mode="bilinear", align_corners=False)


class ResBlock(nn.Module):
    """Diffusion ResBlock: GroupNorm, SiLU, conv; the time embedding added per channel."""

    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(
            nn.GroupNorm(4, cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, 1, 1)
        )
        self.emb = nn.Sequential(nn.SiLU(), nn.Linear(tdim, cout))
        self.out_layers = nn.Sequential(
            nn.GroupNorm(4, cout), nn.SiLU(), nn.Dropout(0.1), nn.Conv2d(cout, cout, 3, 1, 1)
        )
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x) + self.emb(emb)[:, :, None, None]
        return self.skip(x) + self.out_layers(h)


class SpatialAttention(nn.Module):
    """GroupNorm, a 1x1 qkv conv, attention over the pixels, a 1x1 output conv, residual."""

    def __init__(self, channels: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(4, channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w)
        q, k, v = qkv.permute(1, 0, 2, 4, 3).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(out.transpose(2, 3).reshape(b, c, h, w))


class DiffusionUNet(nn.Module):
    """A diffusion UNet level: sinusoidal timestep embedding, ResBlocks, attention, a strided
    down conv and a nearest-upsampling up path with a skip concatenation."""

    def __init__(self, ch: int = 16, tdim: int = 32) -> None:
        super().__init__()
        self.tdim = tdim
        self.time = nn.Sequential(nn.Linear(ch, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(4, ch, 3, padding=1)
        self.down = ResBlock(ch, ch, tdim)
        self.downsample = nn.Conv2d(ch, 2 * ch, 3, 2, 1)
        self.mid = ResBlock(2 * ch, 2 * ch, tdim)
        self.attn = SpatialAttention(2 * ch)
        self.up = ResBlock(3 * ch, ch, tdim)
        self.out = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Conv2d(ch, 4, 3, padding=1))

    def timestep_embedding(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        emb = self.time(self.timestep_embedding(t, self.inp.out_channels))
        skip = self.down(self.inp(x), emb)
        h = self.attn(self.mid(self.downsample(skip), emb))
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return self.out(self.up(torch.cat([h, skip], 1), emb))


def diffusion_unet():
    return DiffusionUNet(), (torch.randn(2, 4, 16, 16), torch.tensor([10.0, 500.0]))


def dcgan_decoder():
    """A DCGAN-style generator: linear to a 4x4 map, ConvTranspose2d-BN-ReLU up to 32x32, tanh."""

    def up(cin: int, cout: int) -> list[nn.Module]:
        return [nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        nn.Linear(16, 32 * 16),
        nn.Unflatten(1, (32, 4, 4)),
        *up(32, 16),
        *up(16, 8),
        nn.ConvTranspose2d(8, 3, 4, 2, 1),
        nn.Tanh(),
    )
    return model, (torch.randn(2, 16),)


class ESPCN(nn.Module):
    """Sub-pixel super-resolution (x2): convs with tanh and PixelShuffle, added to the input
    upsampled bilinearly, clamped to the image range."""

    def __init__(self, scale: int = 2) -> None:
        super().__init__()
        self.scale = scale
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 5, padding=2),
            nn.Tanh(),
            nn.Conv2d(16, 8, 3, padding=1),
            nn.Tanh(),
            nn.Conv2d(8, 3 * scale**2, 3, padding=1),
            nn.PixelShuffle(scale),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.interpolate(x, scale_factor=self.scale, mode="bilinear", align_corners=False)
        return (base + self.body(x)).clamp(0.0, 1.0)


class StyleResidual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1),
            nn.Conv2d(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
            nn.ReLU(),
            nn.ReflectionPad2d(1),
            nn.Conv2d(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def style_transfer():
    """Johnson et al.'s transformer net: reflection padding, InstanceNorm, residual blocks,
    nearest upsampling then conv."""

    def conv(cin: int, cout: int, k: int, s: int = 1) -> list[nn.Module]:
        return [
            nn.ReflectionPad2d(k // 2),
            nn.Conv2d(cin, cout, k, s),
            nn.InstanceNorm2d(cout, affine=True),
            nn.ReLU(),
        ]

    model = nn.Sequential(
        *conv(3, 8, 9),
        *conv(8, 16, 3, 2),
        StyleResidual(16),
        StyleResidual(16),
        nn.Upsample(scale_factor=2, mode="nearest"),
        *conv(16, 8, 3),
        nn.ReflectionPad2d(4),
        nn.Conv2d(8, 3, 9),
    )
    return model, _image()


MODELS = {
    "unet": lambda: (UNet(), _image(34)),  # 34 -> 17 -> 8: the up path pads 16 to 17
    "fpn": lambda: (FPN(), _image()),
    "yolo_neck": lambda: (YOLONeck(), _image()),
    "deeplab_aspp": lambda: (ASPP(), _image()),
    "diffusion_unet": diffusion_unet,
    "dcgan_decoder": dcgan_decoder,
    "espcn": lambda: (ESPCN(), _image(16)),
    "style_transfer": style_transfer,
}
