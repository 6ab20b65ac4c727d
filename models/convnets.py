"""Convolutional post-processors on the whole grid: the ENS-10 LeNet-style patch model and the U-Net.

Both take ``batch["x"]`` (B, C, H, W) and return K head outputs (``NetIO.outputs``; (a, b) for the
Gaussian), each (B, H, W). Padding
follows the globe: periodic in longitude, replicated at the poles (:func:`earth_pad`). The U-Net
pads any grid (361 rows included) up to a multiple of its down-sampling factor and crops back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from postcast.models.postprocessors import Batch, Outputs, zero_init
from postcast.models.registry import NetIO, architecture


def earth_pad(x: torch.Tensor, top: int, bottom: int = -1, left: int = -1, right: int = -1) -> torch.Tensor:
    """Pad (B, C, H, W): periodic in longitude (W), replicated in latitude (H).
    ``earth_pad(x, p)`` pads p on every side."""
    bottom = top if bottom < 0 else bottom
    left = top if left < 0 else left
    right = left if right < 0 else right
    if left or right:
        x = torch.cat([x[..., x.shape[-1] - left :], x, x[..., :right]], dim=-1)
    if top or bottom:
        x = F.pad(x, (0, 0, top, bottom), mode="replicate")
    return x


class LeNet(nn.Module):
    """ENS-10 LeNet-style model: each point sees its 7 x 7 neighbourhood through three valid 3 x 3
    convolutions (64, 32, 16 channels; ELU then BatchNorm), concatenated with the point's own inputs
    (location and season included), then a dense 6-unit layer and the K head outputs. Done as
    convolutions over the padded grid, which equals cutting a patch per point, without the copies."""

    def __init__(
        self, in_channels: int, widths: tuple[int, int, int] = (64, 32, 16), hidden: int = 6, outputs: int = 2
    ):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            layers += [nn.Conv2d(c, w, 3), nn.ELU(), nn.BatchNorm2d(w)]
            c = w
        self.patch = nn.Sequential(*layers)
        self.reach = len(widths)  # each valid 3 x 3 conv shrinks by 1 per side
        self.dense = nn.Sequential(
            nn.Conv2d(c + in_channels, hidden, 1), nn.ELU(), zero_init(nn.Conv2d(hidden, outputs, 1))
        )

    def forward(self, batch: Batch) -> Outputs:
        x = batch["x"]  # (B, C, H, W)
        feats = self.patch(earth_pad(x, self.reach))  # (B, 16, H, W)
        return tuple(self.dense(torch.cat([feats, x], dim=1)).unbind(1))  # K x (B, H, W)


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


class UNetTrunk(nn.Module):
    """U-Net features (B, base, H, W) for any H, W: ``depth`` down/up levels with channels
    base * 2**level (ENS-10: 32 / 64 / 128), max-pool 2, bilinear up-sampling, skip concatenation."""

    def __init__(self, in_channels: int, base: int = 32, depth: int = 2):
        super().__init__()
        self.depth = depth
        chans = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            [_block(in_channels, chans[0])] + [_block(chans[i], chans[i + 1]) for i in range(depth)]
        )
        self.up = nn.ModuleList([_block(chans[i + 1] + chans[i], chans[i]) for i in reversed(range(depth))])
        self.out_channels = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        f = 2**self.depth
        ph, pw = -h % f, -w % f  # pad up to a multiple of 2**depth (361 rows -> 364), crop at the end
        x = earth_pad(x, ph // 2, ph - ph // 2, pw // 2, pw - pw // 2)
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for block, skip in zip(self.up, reversed(skips[:-1]), strict=True):
            x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([x, skip], dim=1))
        return x[..., ph // 2 : ph // 2 + h, pw // 2 : pw // 2 + w]


class UNet(nn.Module):
    """U-Net post-processor: trunk features -> final 3 x 3 convolution to the K head outputs."""

    def __init__(self, in_channels: int, base: int = 32, depth: int = 2, outputs: int = 2):
        super().__init__()
        self.trunk = UNetTrunk(in_channels, base, depth)
        self.head = zero_init(nn.Conv2d(base, outputs, 3, padding=1))

    def forward(self, batch: Batch) -> Outputs:
        return tuple(self.head(self.trunk(batch["x"])).unbind(1))  # K x (B, H, W)


# --- architectures ------------------------------------------------------------------------------
@architecture("lenet")
@dataclass(frozen=True)
class LeNetArchitecture:
    """The ENS-10 LeNet-style patch model."""

    def build(self, io: NetIO) -> nn.Module:
        return LeNet(io.in_channels, outputs=io.outputs)


@architecture("unet")
@dataclass(frozen=True)
class UNetArchitecture:
    """U-Net: ``base_filters`` channels at full resolution, doubling at each of 2 down levels."""

    base_filters: int = 32

    def build(self, io: NetIO) -> nn.Module:
        return UNet(io.in_channels, self.base_filters, outputs=io.outputs)
