"""Post-processors: networks mapping inputs (B, C, H, W) to head outputs (a, b), each (B, H, W).

All share the spread-relative Gaussian head of :mod:`postcast.models.losses`; a zero output
reproduces the raw ensemble. This module holds the pointwise models (MLP, local EMOS); grid
models (LeNet, U-Net, Transformer, SMoE) come with issue 3.
"""

from __future__ import annotations

import torch
from torch import nn

from postcast.models.losses import CRPSGaussianLoss, gaussian_head


class PointwiseMLP(nn.Module):
    """ENS-10 MLP baseline: per grid point, inputs -> hidden (ReLU) -> (a, b); shared weights.
    Implemented as 1x1 convolutions, so a whole date is one batch (B, C, H, W)."""

    def __init__(self, in_channels: int, hidden: int = 128):
        super().__init__()
        out = nn.Conv2d(hidden, 2, 1)
        nn.init.zeros_(out.weight)  # start at the raw ensemble (a = b = 0)
        nn.init.zeros_(out.bias)  # type: ignore[arg-type]  # Conv2d(bias=True) has a bias
        self.net = nn.Sequential(nn.Conv2d(in_channels, hidden, 1), nn.ReLU(), out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(x)  # (B, 2, H, W)
        return out[:, 0], out[:, 1]


class LocalEMOS(nn.Module):
    """EMOS with its own coefficients at every grid point: a = a0 + a1 * x_target_mean,
    b = b0 + b1 * x_target_std (x: the normalised ensemble mean/std channels of the target)."""

    def __init__(self, grid: tuple[int, int], mean_channel: int, std_channel: int):
        super().__init__()
        self.mean_channel, self.std_channel = mean_channel, std_channel
        self.coef = nn.Parameter(torch.zeros(4, *grid))  # (a0, a1, b0, b1) per point

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.coef[0] + self.coef[1] * x[:, self.mean_channel]
        b = self.coef[2] + self.coef[3] * x[:, self.std_channel]
        return a, b


def predict(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, sigma) in physical units for a batch from :class:`StoreDataset`."""
    a, b = model(batch["x"])
    return gaussian_head(a, b, batch["m"], batch["s"])


def crps_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    mu, sigma = predict(model, batch)
    return CRPSGaussianLoss()(mu, sigma, batch["y"])
