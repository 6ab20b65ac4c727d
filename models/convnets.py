"""Convolutional post-processors on the whole grid: the ENS-10 LeNet-style patch model and the U-Net.

Both take ``batch["x"]`` (B, C, H, W) and return K head outputs (``NetIO.outputs``; (a, b) for the
Gaussian), each (B, H, W). Padding, of every convolution,
follows the globe: periodic in longitude, replicated at the poles (:func:`earth_pad`, :class:`EarthConv`). The U-Net
pads any grid (361 rows included) up to a multiple of its down-sampling factor and crops back.

Location: both read the location features of the sample (sin lat, cos lat sin lon, cos lat cos lon) among
their inputs and, with ``embedding: E`` > 0, E learned numbers per grid point (:class:`PointEmbedding`) joined
to the inputs, as the MLP's (Rasp and Lerch 2018): a convolution shares its weights over the globe, so what
belongs to a place (a static bias) has no other way in. Such a model is bound to its training grid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from postcast.datasets.core.errors import ConfigError
from postcast.models.earth import PointEmbedding, check_embedding, earth_pad
from postcast.models.postprocessors import Batch, Outputs, zero_init
from postcast.models.registry import NetIO, architecture

NORMS = ("batch", "group", "none")  # the U-Net blocks' normalisation (model.net.norm)


def check_norm(name: str, norm: str) -> None:
    """An architecture's ``norm`` option: one of :data:`NORMS` (ConfigError naming it otherwise)."""
    if norm not in NORMS:
        msg = f"model.net ({name}) norm={norm!r}: choose one of {', '.join(NORMS)}"
        raise ConfigError(msg)


class LeNet(nn.Module):
    """ENS-10 LeNet-style model: each point sees its 7 x 7 neighbourhood through three valid 3 x 3
    convolutions (64, 32, 16 channels; ELU then BatchNorm), concatenated with the point's own inputs
    (location and season included), then a dense 6-unit layer and the K head outputs. Done as
    convolutions over the padded grid, which equals cutting a patch per point, without the copies."""

    def __init__(
        self,
        in_channels: int,
        widths: tuple[int, int, int] = (64, 32, 16),
        hidden: int = 6,
        outputs: int = 2,
        *,
        grid: tuple[int, int] = (0, 0),
        embedding: int = 0,
    ):
        super().__init__()
        self.embedding = PointEmbedding(embedding, grid)
        in_channels += embedding
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
        x = self.embedding(batch["x"])  # (B, C + E, H, W)
        feats = self.patch(earth_pad(x, self.reach))  # (B, 16, H, W)
        return tuple(self.dense(torch.cat([feats, x], dim=1)).unbind(1))  # K x (B, H, W)


class EarthConv(nn.Conv2d):
    """A 3 x 3 convolution padded as the globe (:func:`earth_pad`): periodic in longitude, replicated at the
    poles. Zero padding would tell every layer where the grid's edges are, and so where each point is."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__(c_in, c_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(earth_pad(x, 1))  # (B, C_out, H, W)


def _norm(kind: str, channels: int) -> nn.Module:
    """BatchNorm (statistics of the batch), GroupNorm (of each sample's groups of 8 channels: the same in
    training and evaluation, whatever the batch size) or none."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(max(1, channels // 8), channels)
    return nn.Identity()


def _block(c_in: int, c_out: int, norm: str = "batch") -> nn.Sequential:
    return nn.Sequential(
        EarthConv(c_in, c_out),
        _norm(norm, c_out),
        nn.ReLU(),
        EarthConv(c_out, c_out),
        _norm(norm, c_out),
        nn.ReLU(),
    )


class UNetTrunk(nn.Module):
    """U-Net features (B, base [+ E], H, W) for any H, W: ``depth`` down/up levels with channels
    base * 2**level (ENS-10: 32 / 64 / 128), max-pool 2, bilinear up-sampling, skip concatenation; with
    ``embedding`` > 0, E learned numbers per point of ``grid`` join the inputs (:class:`PointEmbedding`, read
    through a Gaussian filter of ``smoothing`` grid cells when > 0) and, by a skip connection, the features:
    (B, base + E, H, W), so a head reads each point's own numbers too.
    ``between(channels, level_grid)``, when given, builds a layer put between the decoder blocks (after each
    up block but the last, on its channels and its level's grid: the padded grid halved ``level`` times)."""

    def __init__(
        self,
        in_channels: int,
        base: int = 32,
        depth: int = 2,
        *,
        grid: tuple[int, int] = (0, 0),
        embedding: int = 0,
        smoothing: float = 0.0,
        between: Callable[[int, tuple[int, int]], nn.Module] | None = None,
        norm: str = "batch",
    ):
        super().__init__()
        self.embedding = PointEmbedding(embedding, grid, smoothing)
        in_channels += embedding
        self.depth = depth
        chans = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            [_block(in_channels, chans[0], norm)] + [_block(chans[i], chans[i + 1], norm) for i in range(depth)]
        )
        self.up = nn.ModuleList([_block(chans[i + 1] + chans[i], chans[i], norm) for i in reversed(range(depth))])
        f = 2**depth
        padded = (grid[0] + -grid[0] % f, grid[1] + -grid[1] % f)
        self.between = nn.ModuleList(
            [between(chans[i], (padded[0] >> i, padded[1] >> i)) for i in reversed(range(1, depth))]
            if between is not None
            else []
        )
        self.out_channels = base + embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embedding(x)  # (B, C + E, H, W)
        own = x[:, x.shape[1] - self.embedding.channels :]  # (B, E, H, W): the points' own numbers
        h, w = x.shape[-2:]
        f = 2**self.depth
        ph, pw = -h % f, -w % f  # pad up to a multiple of 2**depth (361 rows -> 364), crop at the end
        x = earth_pad(x, ph // 2, ph - ph // 2, pw // 2, pw - pw // 2)
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for i, (block, skip) in enumerate(zip(self.up, reversed(skips[:-1]), strict=True)):
            x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([x, skip], dim=1))
            if i < len(self.between):
                x = self.between[i](x)
        return torch.cat([x[..., ph // 2 : ph // 2 + h, pw // 2 : pw // 2 + w], own], dim=1)  # (B, base + E, H, W)


class PointHead(nn.Module):
    """A pointwise head: the trunk's features and the point's own inputs -> 2 hidden layers (ReLU, 1 x 1)
    -> K outputs, the last layer zero at the start."""

    def __init__(self, c_features: int, c_inputs: int, hidden: int, outputs: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(c_features + c_inputs, hidden, 1),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 1),
            nn.ReLU(),
            zero_init(nn.Conv2d(hidden, outputs, 1)),
        )

    def forward(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([features, x], dim=1))  # (B, K, H, W)


class UNet(nn.Module):
    """U-Net post-processor: trunk features -> final 3 x 3 convolution to the K head outputs, or with
    ``head`` > 0 a pointwise head of that many hidden units reading the features and the inputs."""

    def __init__(
        self,
        in_channels: int,
        base: int = 32,
        depth: int = 2,
        outputs: int = 2,
        *,
        grid: tuple[int, int] = (0, 0),
        embedding: int = 0,
        smoothing: float = 0.0,
        norm: str = "batch",
        head: int = 0,
    ):
        super().__init__()
        self.trunk = UNetTrunk(in_channels, base, depth, grid=grid, embedding=embedding, smoothing=smoothing, norm=norm)
        c = self.trunk.out_channels
        self.head = PointHead(c, in_channels, head, outputs) if head else zero_init(EarthConv(c, outputs))

    def forward(self, batch: Batch) -> Outputs:
        x = batch["x"]  # (B, C, H, W)
        feats = self.trunk(x)  # (B, base + E, H, W)
        out = self.head(feats, x) if isinstance(self.head, PointHead) else self.head(feats)  # (B, K, H, W)
        return tuple(out.unbind(1))  # K x (B, H, W)


# --- architectures ------------------------------------------------------------------------------
@architecture("lenet")
@dataclass(frozen=True)
class LeNetArchitecture:
    """The ENS-10 LeNet-style patch model."""

    embedding: int = 0  # learned numbers per grid point joined to the inputs (0: none; the model is then grid-free)

    def __post_init__(self) -> None:
        check_embedding("lenet", self.embedding)

    def build(self, io: NetIO) -> nn.Module:
        return LeNet(io.in_channels, outputs=io.outputs, grid=io.grid, embedding=self.embedding)


@architecture("unet")
@dataclass(frozen=True)
class UNetArchitecture:
    """U-Net: ``base_filters`` channels at full resolution, doubling at each of 2 down levels."""

    base_filters: int = 32
    embedding: int = 0  # learned numbers per grid point joined to the inputs (0: none; the model is then grid-free)
    smoothing: float = 0.0  # the embedding read through a Gaussian filter this many grid cells wide (0: none)
    norm: str = "batch"  # normalisation in each block: batch, group or none
    head: int = 0  # hidden units of a pointwise head on the features and inputs (0: a 3 x 3 convolution)

    def __post_init__(self) -> None:
        check_embedding("unet", self.embedding, self.smoothing)
        check_norm("unet", self.norm)

    def build(self, io: NetIO) -> nn.Module:
        return UNet(
            io.in_channels,
            self.base_filters,
            outputs=io.outputs,
            grid=io.grid,
            embedding=self.embedding,
            smoothing=self.smoothing,
            norm=self.norm,
            head=self.head,
        )
