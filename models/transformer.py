"""Ensemble Transformer (after Finn 2021, arXiv 2106.13924): self-attention across ensemble members.

Each member is a token whose features are whole fields. Per member, the inputs are its
standardised perturbation z_j = (x_j - mean) / std of every input variable (from
``batch["members"]``, (B, M, V, H, W)) and the ensemble-mean channels ``batch["x"]`` (B, C, H, W).
A small convolutional embedding (Earth padding, 5 x 5 convolutions, SELU) runs per member; one
attention block mixes members (scores are dot products over channels *and* the whole field, as in
Finn's model; softmax over members); a 1 x 1 convolution gives a correction d_j per member. The
corrected ensemble z_j + d_j of the target variable defines the head outputs

    a = mean_j d_j,    b = log std_j (z_j + d_j) - log std_j z_j

so the zero-initialised output layer reproduces the raw ensemble's law exactly (a = 0, b = 0 to the bit,
also where the members agree and z's std is floored). With ``embedding: E`` > 0, E learned numbers per grid
point join the ensemble-mean channels (:class:`~postcast.models.earth.PointEmbedding`). A
distribution with K > 2 parameters gets its further K - 2 head outputs from a zero-initialised 1 x 1
convolution of the member-averaged features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from postcast.datasets.core.errors import ConfigError
from postcast.models import kernels
from postcast.models.earth import PointEmbedding, check_embedding, earth_pad
from postcast.models.postprocessors import Batch, Outputs, require_members, zero_init
from postcast.models.registry import NetIO, architecture


class _Embed(nn.Module):
    def __init__(self, c_in: int, width: int, layers: int = 3, kernel: int = 5):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(c_in if i == 0 else width, width, kernel) for i in range(layers)])
        self.pad = kernel // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.selu(conv(earth_pad(x, self.pad)))
        return x


class MemberAttention(nn.Module):
    """Multi-head self-attention across members; tokens are (C, H, W) fields. (B, M, C, H, W) in/out."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            msg = f"transformer width {width} must be a multiple of heads {heads}"
            raise ConfigError(msg)
        self.heads = heads
        self.qkv = nn.Conv2d(width, 3 * width, 1)
        self.out = nn.Conv2d(width, width, 1)
        self.norm = nn.GroupNorm(1, width)  # LayerNorm over (C, H, W), on any grid

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, m, c, hh, ww = h.shape
        q, k, v = self.qkv(self.norm(h.flatten(0, 1))).view(b, m, 3, self.heads, c // self.heads, hh, ww).unbind(2)
        # q, k, v: (B, M, heads, c/heads, H, W); scores over members: (B, heads, M, M)
        scores = torch.einsum("bihxyz,bjhxyz->bhij", q, k) / math.sqrt(q[0, 0].numel() / self.heads)
        mixed = torch.einsum("bhij,bjhxyz->bihxyz", scores.softmax(dim=-1), v).reshape(b * m, c, hh, ww)
        return torch.relu(h + self.out(mixed).view(b, m, c, hh, ww))


class EnsembleTransformer(nn.Module):
    def __init__(
        self,
        in_channels: int,
        n_variables: int,
        variable_index: int,
        width: int = 16,
        heads: int = 4,
        blocks: int = 1,
        outputs: int = 2,
        *,
        grid: tuple[int, int] = (0, 0),
        embedding: int = 0,
    ):
        super().__init__()
        self.variable_index = variable_index
        self.embedding = PointEmbedding(embedding, grid)
        self.embed = _Embed(n_variables + in_channels + embedding, width)
        self.blocks = nn.ModuleList([MemberAttention(width, heads) for _ in range(blocks)])
        self.correct = zero_init(nn.Conv2d(width, 1, 1))
        self.extra = zero_init(nn.Conv2d(width, outputs - 2, 1)) if outputs > 2 else None

    def forward(self, batch: Batch) -> Outputs:
        members = require_members(batch, "transformer")  # (B, M, V, H, W), normalised
        b, m = members.shape[:2]
        _, _, z = kernels.ensemble_standardise(members)  # standardised perturbations, one fused pass
        x = self.embedding(batch["x"]).unsqueeze(1).expand(-1, m, -1, -1, -1)  # (B, M, C + E, H, W)
        h = self.embed(torch.cat([z, x], dim=2).flatten(0, 1))  # (B*M, width, H, W)
        h = h.view(b, m, *h.shape[1:])
        for block in self.blocks:
            h = block(h)
        d = self.correct(h.flatten(0, 1)).view(b, m, *h.shape[-2:])  # (B, M, H, W), units of the raw std
        zv = z[:, :, self.variable_index]  # (B, M, H, W)
        shift, log_spread = d.mean(dim=1), _log_std(zv + d) - _log_std(zv)  # a, b: (B, H, W)
        if self.extra is None:
            return shift, log_spread
        return (shift, log_spread, *self.extra(h.mean(dim=1)).unbind(1))  # (B, width, H, W) -> K - 2 x (B, H, W)


def _log_std(z: torch.Tensor) -> torch.Tensor:
    """log of the population std over members (dim 1), floored at 1e-3: (B, M, H, W) -> (B, H, W)."""
    return torch.log(z.std(dim=1, unbiased=False).clamp_min(1e-3))


# --- architectures ------------------------------------------------------------------------------
@architecture("transformer", needs_members=True)
@dataclass(frozen=True)
class TransformerArchitecture:
    """Ensemble Transformer: attention across members (reads the members)."""

    width: int = 16  # channels of the per-member convolutional embedding
    heads: int = 4  # attention heads
    embedding: int = 0  # learned numbers per grid point joined to the inputs (0: none; the model is then grid-free)

    def __post_init__(self) -> None:
        check_embedding("transformer", self.embedding)

    def build(self, io: NetIO) -> nn.Module:
        return EnsembleTransformer(
            io.in_channels,
            io.n_variables,
            io.target_variable,
            self.width,
            self.heads,
            outputs=io.outputs,
            grid=io.grid,
            embedding=self.embedding,
        )
