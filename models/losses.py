"""Training losses and the spread-relative distribution head shared by every post-processor.

Head: a network emits K raw maps per point (K = ``distributions.get(name).n_raw``); with the raw
ensemble mean ``m`` and population std ``s`` of the target they become the predictive distribution's
parameters (:mod:`postcast.models.distributions`). For the default ``gaussian`` (the ENS-10 reference
head, docs/ens10.md) the two outputs ``(a, b)`` define

    mu = m + s * a,    sigma = s * exp(b)

so ``a = b = 0`` reproduces the raw ensemble's Gaussian fit. ``s`` is floored (identical members
would give sigma = 0). The loss is the family's closed-form CRPS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from postcast.datasets.core.errors import BadInputError
from postcast.models import distributions, kernels
from postcast.models.distributions import Distribution


def gaussian_head(
    a: torch.Tensor, b: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor, *, min_std: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, sigma) from network outputs (a, b) and the raw ensemble (m, s); all the same shape."""
    s = ens_std.clamp_min(min_std)
    return ens_mean + s * a, s * torch.exp(b)


def crps_gaussian(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS of N(mu, sigma^2) at y, elementwise and differentiable (units of y); fused
    forward + gradient on GPUs (see :mod:`postcast.models.kernels`)."""
    return kernels.crps_gaussian(mu, sigma, y)


class CRPSGaussianLoss(torch.nn.Module):
    """Mean closed-form Gaussian CRPS over all elements (NaN targets, e.g. missing truth, ignored)."""

    def forward(self, mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        valid = torch.isfinite(y)
        if not bool(valid.any()):
            msg = "CRPSGaussianLoss: every target is NaN; check the truth in the store"
            raise BadInputError(msg)
        return crps_gaussian(mu[valid], sigma[valid], y[valid]).mean()


def distribution_head(
    outs: Sequence[torch.Tensor],
    ens_mean: torch.Tensor,
    ens_std: torch.Tensor,
    name: str = "gaussian",
    *,
    min_std: float = 1e-6,
) -> Distribution:
    """The predictive distribution ``name`` from K raw network maps (each (B, H, W)) and the raw ensemble
    (m, s), (B, H, W); for ``gaussian`` the same (mu, sigma) as :func:`gaussian_head`."""
    raw = torch.stack(list(outs), dim=-1)  # (B, H, W, K)
    return distributions.get(name).from_raw(raw, ens_mean, ens_std.clamp_min(min_std))


class CRPSLoss(torch.nn.Module):
    """Mean closed-form CRPS of any distribution family over the finite targets (NaN truth ignored; the
    parameters are masked before scoring, so no NaN reaches the gradients)."""

    def forward(self, dist: Distribution, y: torch.Tensor) -> torch.Tensor:
        valid = torch.isfinite(y)  # (B, H, W)
        if not bool(valid.any()):
            msg = "CRPSLoss: every target is NaN; check the truth in the store"
            raise BadInputError(msg)
        return dist.select(valid).crps(y[valid]).mean()
